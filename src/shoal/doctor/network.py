"""Network and launcher checks of one node: the launcher's variables, the host name, the socket
interface variables, and the way to the master (its name, the route, its port).

They use what the launchers use (:mod:`shoal.env.network`, :mod:`shoal.env.detect`,
:func:`shoal.launch.rendezvous.plan_for`), so the doctor and a job started here see the same thing.
Only the port check sends packets: one TCP connection attempt to the master (and, when that gets no
answer, one to a neighbouring port, to tell a firewall that drops one port from a host that is down).
"""

from __future__ import annotations

import os
import socket
from typing import Any

from shoal.doctor.model import Check, fail, ok, warn
from shoal.env import detect_environment
from shoal.env.network import (
    Route,
    UnresolvedHost,
    default_route_interface,
    interface_addresses,
    is_loopback,
    probe_tcp,
    resolve,
    route_to,
)
from shoal.errors import ShoalError

PORT_PROBE_S = 3.0
"""How long one TCP connection attempt to the master may take (a dropped SYN never answers)."""
IFNAME_VARS = {"GLOO_SOCKET_IFNAME": "gloo", "NCCL_SOCKET_IFNAME": "nccl"}


def launcher_check(environ: dict[str, str] | None = None) -> Check:
    """The launcher's variables: shoal's detection refuses contradictions (RANK >= WORLD_SIZE, a
    half-set torchrun environment, bad PET_* from a Kubeflow operator) with a named error."""
    from shoal.env.operator import operator_defaults

    environ = dict(os.environ) if environ is None else environ
    try:
        info = detect_environment(environ)
        operator_defaults(environ, gpus=0)
    except ShoalError as err:
        return fail("launcher-env", err.message, err.hint)
    if info.scheme == "local":
        return ok("launcher-env", "no launcher variables: one process (a launcher or --nproc/--nnodes adds ranks)")
    return ok(
        "launcher-env",
        f"{info.scheme}: rank {info.rank} of {info.world_size}, node {info.node_rank} of {info.num_nodes}, "
        f"master {info.main_address}:{info.main_port}",
        scheme=info.scheme,
        rank=info.rank,
        world_size=info.world_size,
    )


def hostname_check(own_address: str | None = None, *, across_nodes: bool = True) -> Check:
    """This node's name must resolve to an address the other nodes reach, not to loopback: torch
    advertises it (gloo without GLOO_SOCKET_IFNAME, NCCL without NCCL_SOCKET_IFNAME, the c10d agent
    without --local-addr), and the other nodes then connect to themselves. Only ``across_nodes`` (a
    master elsewhere, or a job of several nodes) is it worth a warning."""
    name = socket.gethostname()
    own = own_address or _outward_address()
    mapping = f"{own}\t{name}" if own else f"<this node's address>\t{name}"
    try:
        addrs = resolve(name)
    except UnresolvedHost:
        return warn(
            "hostname",
            f"this node's name {name!r} does not resolve here",
            f"add `{mapping}` to /etc/hosts (or DNS): torch advertises the host name unless told otherwise",
            hostname=name,
        )
    loopback = [a for a in addrs if is_loopback(a)]
    if loopback and not across_nodes:
        return ok(
            "hostname",
            f"{name} resolves to {loopback[0]} (loopback): fine on one node (across nodes it needs --master to judge)",
            hostname=name,
            addresses=addrs,
        )
    if loopback:
        return warn(
            "hostname",
            f"{name} resolves to {loopback[0]} (loopback) here: torch advertises that address to the other "
            "nodes unless GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME / --local-addr say otherwise",
            f"map {name} to this node's own address in /etc/hosts (`{mapping}`, not {loopback[0]}); shoal's "
            "launchers and shoal.init set the interface themselves, but torchrun, Accelerate and plain "
            "init_process_group do not, and their jobs hang or fail in connectFullMesh",
            hostname=name,
            addresses=addrs,
        )
    return ok("hostname", f"{name} resolves to {addrs[0]}", hostname=name, addresses=addrs)


def socket_ifname_checks(route_ifname: str | None) -> list[Check]:
    """GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, when set, must name interfaces of this node (and the
    one that routes to the master, when it is known)."""
    names = [name for _, name in socket.if_nameindex()]
    found = []
    for var, library in IFNAME_VARS.items():
        check = f"{library}-socket-ifname"
        raw = os.environ.get(var, "").strip()
        if not raw:
            via = f" ({route_ifname})" if route_ifname else ""
            found.append(
                ok(check, f"{var} unset: shoal's launchers set it to the interface that routes to the master{via}")
            )
            continue
        matched, missing = _match_ifnames(raw, names, prefixes=library == "nccl")
        fix = f"set {var} to the interface the nodes share{f' ({route_ifname} routes to the master)' if route_ifname else ''}, or unset it: shoal's launchers pick it"
        if raw.startswith("^"):
            found.append(ok(check, f"{var}={raw}: excludes {raw[1:]}", value=raw))
        elif missing and not matched:
            found.append(
                fail(check, f"{var}={raw}: no such interface on this node (it has {', '.join(names)})", fix, value=raw)
            )
        elif missing:
            found.append(warn(check, f"{var}={raw}: {', '.join(missing)} not on this node", fix, value=raw))
        elif route_ifname and route_ifname not in matched:
            found.append(
                warn(
                    check,
                    f"{var}={raw}, but the route to the master leaves through {route_ifname}",
                    fix,
                    value=raw,
                )
            )
        else:
            found.append(ok(check, f"{var}={raw}: {', '.join(matched)}", value=raw))
    return found


def _match_ifnames(raw: str, names: list[str], *, prefixes: bool) -> tuple[list[str], list[str]]:
    """Interfaces ``raw`` selects and entries that select none. NCCL matches prefixes (``=name``:
    exactly); gloo takes exact names."""
    matched: list[str] = []
    missing: list[str] = []
    for entry in (e.strip() for e in raw.lstrip("^").split(",")):
        if not entry:
            continue
        exact = not prefixes or entry.startswith("=")
        wanted = entry.lstrip("=")
        hits = [n for n in names if (n == wanted if exact else n.startswith(wanted))]
        (matched.extend(hits) if hits else missing.append(entry))
    return matched, missing


def master_checks(host: str, port: int | None) -> tuple[list[Check], Route | None]:
    """The master's name, the route to it, and (``port`` given) its port: free when this node is the
    master, reachable otherwise. Returns the checks and the route (None if there is none)."""
    checks = []
    try:
        ips = resolve(host)
    except UnresolvedHost as err:
        return [fail("master-resolves", err.message, err.hint, master=host)], None
    shown = f"{host} is an address" if ips[0] == host.strip("[]") else f"{host} resolves to {ips[0]}"
    checks.append(ok("master-resolves", shown, master=host, addresses=ips))
    try:
        route = route_to(host)
    except ShoalError as err:
        return [*checks, fail("route", err.message, err.hint, master=host)], None
    via = f"{route.addr} on {route.ifname}" if route.ifname else route.addr
    data = {"master_ip": route.master_ip, "address": route.addr, "interface": route.ifname}
    if route.ifname is None and not route.loopback:
        checks.append(
            warn(
                "route",
                f"to {route.master_ip}: from {route.addr}, on an interface not found",
                "set GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME to the interface the nodes share",
                **data,
            )
        )
    else:
        checks.append(ok("route", f"to {route.master_ip}: from {via} ({route.why})", **data))
    if port is not None:
        checks.append(port_check(route, port))
    return checks, route


def port_check(route: Route, port: int) -> Check:
    """On the master: nothing else may hold the rendezvous port. Elsewhere: the master must answer on it
    (a refusal is fine before the master starts; silence is a firewall, or a host that is down)."""
    from shoal.launch.ports import check_port_free

    data: dict[str, Any] = {"master_ip": route.master_ip, "port": port}
    if route.master_is_local or route.loopback:
        bind = route.master_ip if route.loopback else route.addr
        try:
            check_port_free(
                port,
                host=bind,
                hint=f"stop what holds it (`ss -ltnp 'sport = :{port}'`) or pick another port, the same on every node",
            )
        except ShoalError as err:
            return fail(
                "master-port", f"{err.message} (this node is the master: the rendezvous listens here)", err.hint, **data
            )
        return ok(
            "master-port",
            f"port {port} is free on {bind} (this node is the master: the rendezvous listens here)",
            **data,
        )
    status = probe_tcp(route.master_ip, port, timeout=PORT_PROBE_S)
    data["status"] = status
    target = f"{route.master_ip}:{port}"
    if status == "open":
        return ok("master-port", f"{target} answers (the master's rendezvous is up)", **data)
    if status == "refused":
        return ok(
            "master-port", f"{target} is reachable (refused: nothing listens yet; the master's job opens it)", **data
        )
    here = f"{socket.gethostname()} ({route.addr})"
    other = port + 1 if port < 65535 else port - 1
    neighbour = probe_tcp(route.master_ip, other, timeout=PORT_PROBE_S)
    data["neighbour"] = {"port": other, "status": neighbour}
    if neighbour in ("open", "refused"):
        return fail(
            "master-port",
            f"port {port} of {route.master_ip} does not answer from {here} ({status}) while port {other} does: "
            f"a firewall drops port {port}",
            f"allow TCP port {port} from this node to the master, and the ports above 1024 that gloo/NCCL use "
            "between all nodes (`nft list ruleset` / `iptables -S` on this node, the master, and in between)",
            **data,
        )
    return fail(
        "master-port",
        f"{route.master_ip} does not answer from {here} on port {port} or {other} ({status})",
        f"check that the master is up and that {route.master_ip} is its address on a network this node "
        f"shares (`ip route get {route.master_ip}`), and that no firewall drops the traffic",
        **data,
    )


def plan_description(options: Any) -> dict[str, Any] | None:
    """What a job started here with ``options`` would listen on and advertise (the launchers' own plan),
    or None when the plan cannot be made (the route checks say why)."""
    from shoal.launch.rendezvous import plan_for

    try:
        plan = plan_for(options)
    except ShoalError:
        return None
    return {
        "backend": plan.backend,
        "endpoint": plan.endpoint,
        "hosts_store": plan.hosts_store,
        "store_port": plan.port or None,
        "bind_addr": plan.bind_addr,
        "interface": plan.bind_ifname,
        "advertise": plan.local_addr,
        "environ": dict(plan.environ),
        "node_rank": plan.node_rank if plan.backend == "static" and not plan.single_node else None,
        "warnings": list(plan.warnings),
    }


def _outward_address() -> str | None:
    """This node's address on its default route's interface (or its only non-loopback one)."""
    addrs = {
        name: [a for a in found if ":" not in a and not is_loopback(a)] for name, found in interface_addresses().items()
    }
    default = default_route_interface()
    if default and addrs.get(default):
        return addrs[default][0]
    outward = [found[0] for found in addrs.values() if found]
    return outward[0] if len(outward) == 1 else None
