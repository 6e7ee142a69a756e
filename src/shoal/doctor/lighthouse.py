"""The ``lighthouse`` check: a fault-tolerant job's torchft lighthouse (docs/FAULT_TOLERANCE.md).

- ``--lighthouse http://HOST:PORT`` (or ``TORCHFT_LIGHTHOUSE``): a lighthouse that should be up
  answers a TCP connection within :data:`~shoal.doctor.network.PORT_PROBE_S`; a refusal or
  silence names the endpoint.
- ``--fault-tolerance`` with ``--master``: node 0 serves the lighthouse on the master's port, so on
  the master that port must be free on the address it would bind; elsewhere the master must answer
  on it (refused is fine: node 0's job opens it).
- ``--fault-tolerance`` on one node: the lighthouse binds a free port on 127.0.0.1; one is taken and
  given back.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from shoal.doctor.model import Check, fail, ok
from shoal.doctor.network import PORT_PROBE_S
from shoal.env.network import Route, bracket, probe_tcp
from shoal.errors import ShoalError

LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"
"""torchft's own variable for the lighthouse's URL (what the groups connect to)."""


def parse_lighthouse(url: str) -> tuple[str, int]:
    """``http://HOST:PORT`` (IPv6 in brackets) -> (host, port); ShoalError naming the value."""
    from shoal.launch.options import parse_endpoint

    hint = "write it as http://HOST:PORT, e.g. --lighthouse http://10.0.0.1:29510"
    text = url.strip()
    rest = text.split("://", 1)[1] if "://" in text else text
    rest = rest.rstrip("/")
    try:
        host, port = parse_endpoint(rest, 0)
    except ShoalError:
        raise ShoalError(f"bad lighthouse URL {url!r}", hint) from None
    if port == 0:
        raise ShoalError(f"bad lighthouse URL {url!r}: no port", hint)
    return host, port


def lighthouse_check(
    url: str | None, *, fault_tolerance: bool, route: Route | None = None, master_port: int | None = None
) -> Check | None:
    """The lighthouse's row, or None when the job is not fault-tolerant (no URL, no flag).

    ``url``: ``--lighthouse`` (default ``TORCHFT_LIGHTHOUSE``). ``route``/``master_port``: the way to
    ``--master`` (the lighthouse's address and port when the job runs its own across nodes)."""
    url = url or os.environ.get(LIGHTHOUSE_ENV) or None
    if url is not None:
        host, port = parse_lighthouse(url)
        return _reachable(host, port, refused_ok=False)
    if not fault_tolerance:
        return None
    if route is not None and master_port is not None:
        if route.master_is_local or route.loopback:
            return _free(route.master_ip if route.loopback else route.addr, master_port, "this node is node 0")
        return _reachable(route.master_ip, master_port, refused_ok=True)
    return _free("127.0.0.1", 0, "one node")


def _reachable(host: str, port: int, *, refused_ok: bool) -> Check:
    endpoint = f"http://{bracket(host)}:{port}"
    status = probe_tcp(host, port, timeout=PORT_PROBE_S)
    data: dict[str, Any] = {"endpoint": endpoint, "status": status}
    if status == "open":
        return ok("lighthouse", f"{endpoint} answers (the lighthouse is up)", **data)
    if status == "refused" and refused_ok:
        return ok("lighthouse", f"{endpoint} is reachable (refused: node 0's job starts the lighthouse there)", **data)
    if status == "refused":
        return fail(
            "lighthouse",
            f"nothing listens on {endpoint} (connection refused)",
            "start the lighthouse first (node 0 of the job serves it: start node 0 first), or pass the URL it "
            "serves on (--lighthouse http://HOST:PORT)",
            **data,
        )
    return fail(
        "lighthouse",
        f"{endpoint} does not answer from {socket.gethostname()} within {PORT_PROBE_S:.0f} s ({status})",
        f"check that the lighthouse's host is up and that {host} is its address on a network this node "
        f"shares, and that no firewall drops TCP port {port}",
        **data,
    )


def _free(host: str, port: int, why: str) -> Check:
    from shoal.launch.ports import check_port_free, find_free_port

    data: dict[str, Any] = {"address": host, "port": port}
    if port == 0:  # one node: the launcher takes any free port
        try:
            data["port"] = find_free_port(host)
        except OSError as err:
            return fail("lighthouse", f"cannot bind a port on {host}: {err}", "check the loopback interface", **data)
        return ok("lighthouse", f"a free port on {host} for the lighthouse ({why}; e.g. {data['port']})", **data)
    try:
        check_port_free(
            port,
            host=host,
            hint=f"stop what holds it (`ss -ltnp 'sport = :{port}'`) or pick another --master-port, the same on every node",
        )
    except ShoalError as err:
        return fail("lighthouse", f"{err.message} ({why}: the lighthouse listens on {host}:{port})", err.hint, **data)
    return ok("lighthouse", f"port {port} is free on {host} ({why}: the lighthouse listens there)", **data)
