"""The ``lighthouse`` check: a fault-tolerant job's torchft lighthouse (docs/FAULT_TOLERANCE.md).

- ``--lighthouse http://HOST:PORT`` (or ``TORCHFT_LIGHTHOUSE``): a lighthouse that should be up
  answers a TCP connection within :data:`~shoal.doctor.network.PORT_PROBE_S`; a refusal or
  silence names the endpoint.
- ``--fault-tolerance`` with ``--master``: node 0 serves the lighthouse on the master's port, so the
  row is the ``master-port`` check's verdict (free on the master, reachable elsewhere), said of the
  lighthouse: the port is checked once.
- ``--fault-tolerance`` on one node: the lighthouse binds a free port on 127.0.0.1; one is taken and
  given back.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from shoal.doctor.model import Check, fail, ok
from shoal.doctor.network import PORT_PROBE_S
from shoal.env.network import bracket, probe_tcp
from shoal.env.replica import LIGHTHOUSE_ENV
from shoal.errors import ShoalError


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


def lighthouse_check(url: str | None, *, fault_tolerance: bool, master_port: Check | None = None) -> Check | None:
    """The lighthouse's row, or None when the job is not fault-tolerant (no URL, no flag).

    ``url``: ``--lighthouse`` (default ``TORCHFT_LIGHTHOUSE``). ``master_port``: the ``master-port``
    check of ``--master``, when there is one: node 0 serves the lighthouse on that port."""
    url = url or os.environ.get(LIGHTHOUSE_ENV) or None
    if url is not None:
        host, port = parse_lighthouse(url)
        return _reachable(host, port)
    if not fault_tolerance:
        return None
    if master_port is not None:
        return Check(
            "lighthouse", master_port.status, f"{master_port.summary}; node 0's lighthouse listens on this port",
            master_port.hint, dict(master_port.data),
        )  # fmt: skip
    return _free_on_loopback()


def _reachable(host: str, port: int) -> Check:
    endpoint = f"http://{bracket(host)}:{port}"
    status = probe_tcp(host, port, timeout=PORT_PROBE_S)
    data: dict[str, Any] = {"endpoint": endpoint, "status": status}
    if status == "open":
        return ok("lighthouse", f"{endpoint} answers (the lighthouse is up)", **data)
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


def _free_on_loopback() -> Check:
    """One node: the launcher binds the lighthouse on any free port of 127.0.0.1."""
    from shoal.launch.ports import find_free_port

    try:
        port = find_free_port("127.0.0.1")
    except OSError as err:
        return fail("lighthouse", f"cannot bind a port on 127.0.0.1: {err}", "check the loopback interface")
    return ok(
        "lighthouse",
        f"a free port on 127.0.0.1 for the lighthouse (one node; e.g. {port})",
        address="127.0.0.1",
        port=port,
    )
