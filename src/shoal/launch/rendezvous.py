"""Multi-node rendezvous: the options, the networking decisions, and failures that say why.

Shared by ``shoal run`` (:mod:`shoal.launch.run`, torchrun's flags) and ``shoal train --nproc``
(:mod:`shoal.launch.local`, the flags added by :func:`add_rendezvous_arguments`). For a job of more
than one node, :func:`plan_rendezvous` decides, unless the user already did:

- the interface and address on the way to the master (:func:`shoal.env.network.route_to`):
  ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` for the workers, and the agent's ``local_addr``,
  which torch otherwise takes from ``socket.getfqdn()`` (often a name for 127.0.0.1);
- for c10d, whether this node hosts the store (``is_host``): the node that owns the endpoint's
  address does. torch guesses from the hostname, which fails whenever the endpoint is an IP address
  and the hostname resolves to loopback: then nobody hosts it and every node waits in vain;
- timeouts from ``--join-timeout``: torch's defaults are 900 s (static), and for c10d 600 s to
  join plus 60 s per store operation, so a typo in an address costs a quarter of an hour.

A rendezvous that fails becomes one :class:`~shoal.errors.ShoalError` (:func:`explain_failure`)
naming the endpoint, how many nodes arrived when that is known, and a ``HINT``.

The launch goes through two backends registered here, ``shoal-c10d`` and ``shoal-static``: torch's
own handlers behind thin wrappers that (1) count the nodes that arrived when joining fails (torch
raises a bare ``RendezvousTimeoutError``), (2) end this node at once when another node ended the
job (torch's agent would leave its workers waiting for the dead ones), and (3) give the workers a
fresh store in every restart round (torch's shared store breaks restarts: pytorch#135712).
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from shoal.env.base import DEFAULT_C10D_PORT, DEFAULT_MAIN_PORT
from shoal.env.network import Route, bracket, probe_tcp, route_to
from shoal.errors import EXIT_ANOTHER_NODE_FAILED, ShoalError

DEFAULT_JOIN_TIMEOUT_S = 60.0
"""Every node gives up this long after it started if the job has not assembled."""
STATIC_DEFAULT_PORT = DEFAULT_MAIN_PORT
C10D_DEFAULT_PORT = DEFAULT_C10D_PORT
DEFAULT_RUN_ID = "shoal"
"""The job id of ``shoal train``'s rendezvous (torchrun's default is "none"); same on every node."""
SOCKET_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
_EXIT_MARGIN_S = 2.0
C10D_BACKEND = "shoal-c10d"
"""torch's c10d rendezvous, registered under shoal's name with a wrapper that counts arrivals."""
STATIC_BACKEND = "shoal-static"
"""torch's static rendezvous; notices departures, and gives restarts a fresh worker store."""


@dataclass
class RendezvousOptions:
    """How the nodes of a job find each other: what the user asked for on the command line."""

    nnodes: str = "1"
    """``N`` or ``MIN:MAX`` (elastic, c10d only)."""
    node_rank: int = 0
    """This node's rank (static rendezvous)."""
    master_addr: str | None = None
    """Address of node rank 0 (static), where the store listens."""
    master_port: int | None = None
    """Port of the store (static; default 29500)."""
    backend: str = "static"
    """``static`` or ``c10d`` (or another torch rendezvous backend, used as is)."""
    endpoint: str | None = None
    """``HOST[:PORT]`` of the c10d store (default port 29400)."""
    run_id: str = DEFAULT_RUN_ID
    """Job id: the same on every node."""
    join_timeout: float = DEFAULT_JOIN_TIMEOUT_S
    """Seconds within which every node must arrive."""
    conf: dict[str, str] = field(default_factory=dict)
    """Extra rendezvous settings (torchrun's ``--rdzv-conf``); the user's win over shoal's."""
    local_addr: str | None = None
    """This node's address to advertise (default: found from the route to the master)."""

    @property
    def min_max_nodes(self) -> tuple[int, int]:
        hint = "give --nnodes N or --nnodes MIN:MAX with 1 <= MIN <= MAX"
        try:
            parts = [int(p) for p in str(self.nnodes).split(":")]
        except ValueError:
            raise ShoalError(f"--nnodes {self.nnodes} is not N or MIN:MAX", hint) from None
        if len(parts) == 1:
            parts *= 2
        if len(parts) != 2 or not 0 < parts[0] <= parts[1]:
            raise ShoalError(f"--nnodes {self.nnodes} is not a valid node count", hint)
        return parts[0], parts[1]


@dataclass
class RendezvousPlan:
    """What shoal decided for this node; :meth:`lines` explains it at start-up."""

    options: RendezvousOptions
    backend: str
    """torch's name of the backend the user asked for (``static``, ``c10d``, ...)."""
    launch_backend: str
    """The backend name to give torch's launcher (``shoal-c10d`` for c10d)."""
    host: str
    port: int
    min_nodes: int
    max_nodes: int
    route: Route | None
    local_addr: str | None
    is_host: bool | None
    """c10d: whether this node hosts the store (None: torch decides, or not c10d)."""
    hosts_store: bool
    """This node serves the rendezvous store (static node 0, or the c10d host)."""
    rdzv_configs: dict[str, Any]
    environ: dict[str, str]
    """Variables to set for the workers (none the user already set)."""
    user_ifnames: dict[str, str]
    """``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` as the user set them."""
    warnings: list[str] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"{bracket(self.host)}:{self.port}"

    @property
    def join_timeout(self) -> float:
        return self.options.join_timeout

    def lines(self, prog: str, nproc: int, extra: str = "") -> list[str]:
        """Start-up lines: what this node waits for, and the network choices and why."""
        workers = f"{nproc} worker{'s' if nproc != 1 else ''}"
        node = (
            f"node {self.options.node_rank} of {self.max_nodes}"
            if self.backend == "static"
            else (f"--nnodes {self.options.nnodes}")
        )
        first = (
            f"{prog}: {workers} on this node ({node}), waiting for the {self.backend} rendezvous at "
            f"{self.endpoint} (join timeout {self.join_timeout:g} s){extra}"
        )
        return [first, self.network_line(prog), *(f"{prog}: warning: {w}" for w in self.warnings)]

    def network_line(self, prog: str) -> str:
        parts = []
        if self.route is not None:
            via = f" on {self.route.ifname}" if self.route.ifname else ""
            parts.append(f"advertising {self.local_addr}{via} ({self.route.why})")
        elif self.local_addr:
            parts.append(f"advertising {self.local_addr}")
        ifnames = [f"{k}={v}" for k, v in self.environ.items() if k in SOCKET_IFNAME_VARS]
        ifnames += [f"{k}={v} (yours)" for k, v in self.user_ifnames.items()]
        if ifnames:
            parts.append(", ".join(ifnames))
        if self.backend == "c10d":
            if self.is_host:
                parts.append("this node hosts the c10d store")
            elif self.is_host is False:
                parts.append(f"the c10d store is hosted by {self.host}")
        return f"{prog}: network: " + "; ".join(parts)

    def configure(self, config: Any) -> None:
        """Apply the plan to a torch ``LaunchConfig`` made from the same options.

        With restarts, the static rendezvous gives each round a fresh worker store (see
        :func:`_create_static_handler`); c10d needs ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` in the
        launcher's environment for the same reason (:data:`RESTART_ENVIRON`).
        """
        config.rdzv_backend = self.launch_backend
        config.rdzv_configs.update(self.rdzv_configs)
        if self.backend == "static" and config.max_restarts > 0:
            config.rdzv_configs["shoal_fresh_store"] = True
        if self.local_addr and not config.local_addr:
            config.local_addr = self.local_addr


def add_rendezvous_arguments(parser: argparse.ArgumentParser, *, max_restarts: bool = False) -> None:
    """Add the multi-node flags (the same as torchrun's) to a subcommand's parser."""
    group = parser.add_argument_group(
        "across nodes",
        "Run the same command on every node (each with its own --node-rank for a static "
        "rendezvous). See docs/MULTINODE.md.",
    )
    group.add_argument(
        "--nnodes",
        default="1",
        metavar="N|MIN:MAX",
        help="number of nodes (MIN:MAX: elastic, with --rdzv-backend c10d)",
    )
    group.add_argument(
        "--node-rank", type=int, default=0, metavar="R", help="this node's rank, 0..N-1 (static rendezvous; default 0)"
    )
    group.add_argument(
        "--master-addr", metavar="ADDR", help="address of node rank 0, where the rendezvous store listens (static)"
    )
    group.add_argument(
        "--master-port",
        type=int,
        metavar="PORT",
        help=f"port of the store on the master (static; default {STATIC_DEFAULT_PORT})",
    )
    group.add_argument(
        "--rdzv-backend",
        default="static",
        choices=("static", "c10d"),
        help="rendezvous: static (fixed node ranks; default) or c10d (elastic)",
    )
    group.add_argument(
        "--rdzv-endpoint",
        metavar="HOST[:PORT]",
        help=f"c10d store address (default port {C10D_DEFAULT_PORT}); the node that owns HOST hosts it",
    )
    group.add_argument(
        "--rdzv-id",
        default=DEFAULT_RUN_ID,
        metavar="ID",
        help=f"job id, the same on every node (default {DEFAULT_RUN_ID})",
    )
    group.add_argument(
        "--join-timeout",
        type=float,
        default=DEFAULT_JOIN_TIMEOUT_S,
        metavar="S",
        help=f"fail when the nodes have not all arrived after S seconds (default {DEFAULT_JOIN_TIMEOUT_S:g})",
    )
    if max_restarts:
        group.add_argument(
            "--max-restarts",
            type=int,
            default=0,
            metavar="K",
            help="restart the workers of every node up to K times after a failure",
        )


def options_from_args(args: argparse.Namespace) -> RendezvousOptions | None:
    """The rendezvous asked for with :func:`add_rendezvous_arguments`' flags; None for one node."""
    opts = RendezvousOptions(
        nnodes=str(args.nnodes),
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
        backend=args.rdzv_backend,
        endpoint=args.rdzv_endpoint,
        run_id=args.rdzv_id,
        join_timeout=args.join_timeout,
    )
    if opts.join_timeout <= 0:
        raise ShoalError(
            f"--join-timeout must be positive, got {opts.join_timeout:g}", "pass seconds, e.g. --join-timeout 60"
        )
    if opts.min_max_nodes[1] == 1 and not (opts.master_addr or opts.master_port or opts.endpoint):
        return None
    return opts


def parse_conf(text: str | None) -> dict[str, str]:
    """torchrun's ``--rdzv-conf k1=v1,k2=v2`` as a dict."""
    conf: dict[str, str] = {}
    for item in (text or "").split(","):
        if item.strip():
            key, sep, value = item.partition("=")
            if not sep:
                raise ShoalError(
                    f"--rdzv-conf item {item!r} is not KEY=VALUE", "write it as --rdzv-conf key1=value1,key2=value2"
                )
            conf[key.strip()] = value.strip()
    return conf


def plan_rendezvous(
    opts: RendezvousOptions, environ: Mapping[str, str] | None = None, *, started: float | None = None
) -> RendezvousPlan:
    """Decide interface, address, store host and timeouts for a multi-node job (see module doc).

    Args:
        opts: what the user asked for.
        environ: the launcher's environment (default ``os.environ``): variables set there win.
        started: ``time.monotonic()`` when the join timeout starts counting (default: now). ``shoal
            run`` passes its own process start, so the command as a whole gives up after
            ``--join-timeout`` seconds, the seconds spent importing torch included.

    Raises ShoalError for what cannot work: a master address that does not resolve or has no
    route from here, an invalid node count, rank or endpoint.
    """
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    environ = os.environ if environ is None else environ
    min_nodes, max_nodes = opts.min_max_nodes
    backend = opts.backend
    static = backend == "static"
    if static:
        if min_nodes != max_nodes:
            raise ShoalError(
                f"--nnodes {opts.nnodes} is elastic, which the static rendezvous cannot do",
                "use --rdzv-backend c10d --rdzv-endpoint HOST:PORT for MIN:MAX, or give one node count",
            )
        if not 0 <= opts.node_rank < max_nodes:
            raise ShoalError(
                f"--node-rank {opts.node_rank} is not in 0..{max_nodes - 1} (--nnodes {opts.nnodes})",
                "give each node its own rank from 0 to N-1; node 0 hosts the rendezvous",
            )
        host = opts.master_addr or "127.0.0.1"
        port = opts.master_port if opts.master_port is not None else STATIC_DEFAULT_PORT
        if opts.endpoint:
            host, port = _parse_endpoint(parse_rendezvous_endpoint, opts.endpoint, STATIC_DEFAULT_PORT)
    else:
        if not opts.endpoint and opts.master_addr:  # as with static: the master hosts the store
            opts.endpoint = f"{opts.master_addr}:{opts.master_port or C10D_DEFAULT_PORT}"
        if not opts.endpoint:
            raise ShoalError(
                f"--rdzv-backend {backend} needs --rdzv-endpoint HOST:PORT",
                "give the address of one of the nodes (it hosts the store) and a free port, the same "
                "on every node, e.g. --rdzv-endpoint 10.0.0.1:29400",
            )
        host, port = _parse_endpoint(parse_rendezvous_endpoint, opts.endpoint, C10D_DEFAULT_PORT)

    conf = dict(opts.conf)
    route = route_to(host)
    local_addr = opts.local_addr or route.addr
    warnings: list[str] = []

    is_host: bool | None = None
    if backend == "c10d":
        if "is_host" in conf:
            is_host = conf["is_host"].strip().lower() in ("1", "true", "yes", "y")
        elif not route.loopback:  # loopback: every node is here; torch's try-bind-then-connect works
            is_host = route.master_is_local
    if static:
        hosts_store = opts.node_rank == 0
        if hosts_store and not route.master_is_local:
            warnings.append(
                f"this is node rank 0, which hosts the store, but {host} is not one of its addresses: "
                "the other nodes will look for the store there (right only behind a NAT or a "
                "service name; otherwise give node 0's own address as --master-addr)"
            )
    else:  # on loopback every node tries to host; torch lets the first one, the others connect
        hosts_store = bool(is_host)

    spent = 0.0 if started is None else max(0.0, time.monotonic() - started)
    # torch overshoots its own timeouts a little (a last connection retry, shutting down), and the
    # failure is then diagnosed (one TCP probe of at most 1 s): keep 2 s of the budget for that.
    timeout = max(1, int(opts.join_timeout - spent - _EXIT_MARGIN_S))
    configs: dict[str, Any] = {}
    if static:
        configs["rank"] = opts.node_rank
        configs["timeout"] = int(conf.get("timeout", timeout))
    elif backend == "c10d":
        configs["join_timeout"] = int(conf.get("join_timeout", timeout))
        configs["read_timeout"] = int(conf.get("read_timeout", min(timeout, 60)))
        # Once MIN nodes are in, torch waits last_call (30 s) for more, within the join deadline.
        configs["last_call_timeout"] = int(conf.get("last_call_timeout", max(1, min(30, timeout // 2))))
        if is_host is not None:
            configs["is_host"] = is_host
    # A node that connects to another's store waits for it here, in Python, until the deadline:
    # torch's store client may sleep a back-off of several seconds past its own timeout.
    connect_timeout = configs.get("timeout" if static else "join_timeout", timeout)
    configs["shoal_deadline"] = time.monotonic() + connect_timeout
    configs["shoal_wait_for_store"] = not hosts_store and not route.loopback
    for key, value in conf.items():
        configs.setdefault(key, value)

    env: dict[str, str] = {}
    user_ifnames = {k: environ[k] for k in SOCKET_IFNAME_VARS if environ.get(k)}
    if route.ifname:
        env.update({k: route.ifname for k in SOCKET_IFNAME_VARS if k not in user_ifnames})
    elif not user_ifnames:
        warnings.append(
            f"no interface found for {local_addr}: set GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME) "
            "to the interface the nodes share"
        )
    if "SHOAL_INIT_TIMEOUT" not in environ:  # shoal.init()'s own join timeout, in the workers
        env["SHOAL_INIT_TIMEOUT"] = f"{opts.join_timeout:g}"
    return RendezvousPlan(
        options=opts,
        backend=backend,
        launch_backend={"c10d": C10D_BACKEND, "static": STATIC_BACKEND}.get(backend, backend),
        host=host,
        port=port,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        route=route,
        local_addr=local_addr,
        is_host=is_host,
        hosts_store=hosts_store,
        rdzv_configs=configs,
        environ=env,
        user_ifnames=user_ifnames,
        warnings=warnings,
    )


def process_started() -> float:
    """``time.monotonic()`` at which this process started (now, if that cannot be read)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
        return time.monotonic() - max(0.0, age)
    except (OSError, ValueError, IndexError):
        return time.monotonic()


def _parse_endpoint(parse: Any, endpoint: str, default_port: int) -> tuple[str, int]:
    try:
        return parse(endpoint, default_port)
    except ValueError as err:
        raise ShoalError(f"bad rendezvous endpoint {endpoint!r}: {err}", "use HOST:PORT") from None


def check_store_port(plan: RendezvousPlan) -> None:
    """Fail at once if this node must serve the store and its port is taken here."""
    from shoal.launch.ports import check_port_free

    if plan.hosts_store and plan.port:
        flag = "--master-port" if plan.backend == "static" else "the port in --rdzv-endpoint"
        check_port_free(
            plan.port, hint=f"pick another {flag} that is free on this node, and give every node the same one"
        )


# --- shoal's rendezvous backends: torch's own, with arrivals counted and departures noticed -----


class JoinFailed(Exception):
    """The c10d rendezvous did not complete; carries what the rendezvous state showed."""

    def __init__(self, cause: BaseException, arrived: int | None, expected: int) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}".rstrip(": "))
        self.cause = cause
        self.arrived = arrived
        self.expected = expected


class NodeLeft(Exception):
    """Another node ended the job (its workers failed for good, or it lost the store)."""


class StoreUnreachable(Exception):
    """The rendezvous store did not accept a connection before the deadline."""

    def __init__(self, host: str, port: int, status: str) -> None:
        super().__init__(f"{host}:{port}: {status}")
        self.status = status
        """What the last attempt got: ``refused``, ``timeout``, ``unreachable``, or an error."""


def _wait_for_store(params: Any) -> float | None:
    """Wait until the store's port accepts connections (``shoal_wait_for_store``); the deadline.

    Raises :class:`StoreUnreachable` at the deadline (``shoal_deadline``, a ``time.monotonic()``
    of this process). A bare connection is harmless to the store: it only ever answers requests.
    """
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    deadline = params.get("shoal_deadline")
    if deadline is None or not params.get_as_bool("shoal_wait_for_store", False):
        return deadline
    host, port = parse_rendezvous_endpoint(params.endpoint, C10D_DEFAULT_PORT)
    status = "timeout"
    while (remaining := deadline - time.monotonic()) > 0:
        status = probe_tcp(host, port, timeout=min(1.0, remaining))
        if status == "open":
            return deadline
        time.sleep(max(0.0, min(0.5, deadline - time.monotonic())))
    raise StoreUnreachable(host, port, status)


RESTART_ENVIRON = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
"""For c10d with restarts: every round gets a fresh worker store, hosted by the new rank 0.

By default the workers of every round share the agent's store, which still holds the previous
round's keys (among them the old gloo addresses): restarted ranks then connect to dead workers and
fail (pytorch/pytorch#135712).
"""
_CLOSED_KEY = "shoal/closed"
_CHECK_EVERY_S = 1.0


def register_backends() -> None:
    """Register ``shoal-c10d`` and ``shoal-static`` with torch's rendezvous registry (idempotent)."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(C10D_BACKEND, _create_c10d_handler)
    rendezvous_handler_registry.register(STATIC_BACKEND, _create_static_handler)


def _handler_base() -> type:
    """A :class:`RendezvousHandler` that delegates to torch's and notices when the job ended.

    The agent asks ``num_nodes_waiting()`` every monitoring interval while the workers run. Here
    that also checks, once a second, whether another node has closed the rendezvous (torch's
    agent closes it when its workers failed and no restart is left) or the store is gone (its host
    node died): then :class:`NodeLeft` ends this node too, at once, instead of its workers waiting
    for the dead ones until a collective times out (30 minutes by default for a plain script).
    """
    from torch.distributed.elastic.rendezvous.api import RendezvousHandler

    class Delegating(RendezvousHandler):
        name = ""

        def __init__(self, inner: Any, endpoint: str) -> None:
            self.inner = inner
            self.endpoint = endpoint
            self.next_check = 0.0

        def get_backend(self) -> str:
            return self.name

        @property
        def use_agent_store(self) -> bool:
            return self.inner.use_agent_store

        def next_rendezvous(self) -> Any:
            return self.inner.next_rendezvous()

        def is_closed(self) -> bool:
            return self.inner.is_closed()

        def set_closed(self) -> None:
            self.inner.set_closed()

        def num_nodes_waiting(self) -> int:
            try:
                waiting = self.inner.num_nodes_waiting()
                if time.monotonic() >= self.next_check:
                    self.next_check = time.monotonic() + _CHECK_EVERY_S
                    closed = self.job_ended()
                else:
                    closed = False
            except Exception as err:
                raise NodeLeft(
                    f"lost the rendezvous store at {self.endpoint} ({_first_line(err)}): the node hosting it stopped"
                ) from None
            if closed:
                raise NodeLeft(
                    f"another node ended the job (the rendezvous at {self.endpoint} "
                    "was closed): its workers failed and could not be restarted"
                )
            return waiting

        def job_ended(self) -> bool:
            return self.inner.is_closed()

        def get_run_id(self) -> str:
            return self.inner.get_run_id()

        def shutdown(self) -> bool:
            return self.inner.shutdown()

        def __getattr__(self, name: str) -> Any:  # anything newer torch versions add
            return getattr(self.inner, name)

    return Delegating


def _create_c10d_handler(params: Any) -> Any:
    """torch's c10d handler (same store, same state machine); a failed join says who came.

    Connecting to the store and joining share one deadline (``shoal_deadline``): a node that starts
    before the store's host waits for it, but the whole rendezvous still fails within the join
    timeout, instead of read timeout + join timeout. torch raises a bare
    ``RendezvousTimeoutError``; here it becomes :class:`JoinFailed` with the number of nodes the
    rendezvous state held.
    """
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    deadline = _wait_for_store(params)
    backend, store = create_backend(params)
    if deadline is not None:
        params.config["join_timeout"] = max(1, int(deadline - time.monotonic()))
    inner = create_handler(store, backend, params)
    max_nodes = params.max_nodes

    class ShoalC10dHandler(_handler_base()):
        name = C10D_BACKEND

        def next_rendezvous(self) -> Any:
            try:
                return inner.next_rendezvous()
            except Exception as err:
                if type(err).__name__ == "RendezvousClosedError":
                    raise NodeLeft(
                        f"the rendezvous at {params.endpoint} was closed: another node ended the job"
                    ) from err
                if type(err).__name__ == "RendezvousTimeoutError":
                    raise JoinFailed(err, _arrived(backend, inner), max_nodes) from err
                raise

    return ShoalC10dHandler(inner, params.endpoint)


def _arrived(backend: Any, inner: Any) -> int | None:
    """Nodes in the rendezvous (participants and waiting), this one included; None if unknown.

    Reads torch's rendezvous state (a pickled ``_RendezvousState``); at the deadline torch has
    already taken this node out again, so it is counted back in.
    """
    try:
        got = backend.get_state()
        if got is None:
            return 1
        state = pickle.loads(got[0])
        me = getattr(inner, "_this_node", None)
        others = {n for n in (*state.participants, *state.wait_list) if n != me}
        return len(others) + 1
    except Exception:  # a torch version with another state layout, or the store is gone
        return None


def _create_static_handler(params: Any) -> Any:
    """torch's static rendezvous; with ``shoal_fresh_store``, a fresh worker store per restart.

    torch's static handler hands the workers its own store in every round, with the keys of the
    rounds before still in it: after a restart the new workers read the dead ones' gloo addresses
    and fail (the c10d twin of this is pytorch/pytorch#135712). With ``shoal_fresh_store`` each
    round works under its own key prefix, and node 0's agent publishes a new address for the
    workers' store (node 0's routable address, a free port) that its rank 0 worker then serves.
    Every node's agent counts rounds the same way: one rendezvous per restart of its workers.

    Static has no shared state but the store: a node that ends the job sets a key in it, which the
    others see (see :func:`_handler_base`); if node 0 ends, the store itself is gone.
    """
    from torch.distributed import PrefixStore
    from torch.distributed.elastic.rendezvous.api import RendezvousInfo, RendezvousStoreInfo
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import create_rdzv_handler

    deadline = _wait_for_store(params)
    inner = create_rdzv_handler(params)
    if deadline is not None and hasattr(inner, "timeout"):  # what is left of it, to connect and wait
        inner.timeout = timedelta(seconds=max(1.0, deadline - time.monotonic()))
    fresh = bool(params.get_as_bool("shoal_fresh_store", False))
    local_addr = params.local_addr

    class ShoalStaticHandler(_handler_base()):
        name = STATIC_BACKEND
        round = 0
        store: Any = None

        @property
        def use_agent_store(self) -> bool:
            return not fresh

        def next_rendezvous(self) -> Any:
            info = inner.next_rendezvous()
            self.store = info.store
            if not fresh:
                return info
            store = PrefixStore(f"shoal/round{self.round}/", info.store)
            self.round += 1
            bootstrap = RendezvousStoreInfo.build(info.rank, store, local_addr=local_addr)
            return RendezvousInfo(store, info.rank, info.world_size, bootstrap)

        def job_ended(self) -> bool:
            return self.store is not None and self.store.check([_CLOSED_KEY])

        def shutdown(self) -> bool:
            if self.store is not None:
                try:
                    self.store.set(_CLOSED_KEY, "1")
                except Exception:  # node 0 (the store) is gone already
                    pass
            return inner.shutdown()

    return ShoalStaticHandler(inner, params.endpoint)


# --- explaining failures ------------------------------------------------------------------------

_CLIENTS_JOINED = re.compile(r"(\d+)/(\d+) clients joined")


def explain_failure(err: BaseException, plan: RendezvousPlan) -> ShoalError:
    """A rendezvous that failed, as one ShoalError naming the endpoint, the arrivals and a hint."""
    if isinstance(err, NodeLeft):
        return ShoalError(
            f"{err}; this node's workers were stopped",
            "the node where a worker failed shows that rank's traceback; look there",
            exit_code=EXIT_ANOTHER_NODE_FAILED,
        )
    arrived: int | None = None
    expected = plan.max_nodes
    if isinstance(err, JoinFailed):
        arrived, expected = err.arrived, err.expected
        detail = ""
    elif isinstance(err, StoreUnreachable):
        detail = str(err)
    else:
        detail = _first_line(err)
        match = _CLIENTS_JOINED.search(detail)
        if match:  # static, on node 0: torch's TCPStore counted the nodes that connected
            arrived, expected = int(match.group(1)), int(match.group(2))
    within = f"within {plan.join_timeout:g} s"
    where = f"the {plan.backend} rendezvous at {plan.endpoint}"
    same = "the same --nnodes, rendezvous address and port" + (
        " (and each its own --node-rank)" if plan.backend == "static" else ""
    )
    if arrived is not None:
        need = f"{plan.min_nodes}" if plan.min_nodes != plan.max_nodes else f"{expected}"
        return ShoalError(
            f"only {arrived} of {need} nodes arrived at {where} {within}",
            f"start the missing node(s) with {same}, check that they reach {plan.endpoint}, or "
            "wait longer with --join-timeout",
            exit_code=1,
        )
    if plan.hosts_store:
        return ShoalError(
            f"{where} failed on this node, which hosts it: {detail or type(err).__name__}",
            f"start every node with {same}; raise --join-timeout if nodes start late",
            exit_code=1,
        )
    status = err.status if isinstance(err, StoreUnreachable) else probe_tcp(plan.host, plan.port)
    route = plan.route
    from_here = f" (from {route.addr} on {route.ifname})" if route and route.ifname else ""
    if status == "refused":
        what = f"nothing listens on port {plan.port} of {plan.host}"
        host_node = "node rank 0" if plan.backend == "static" else f"the node that owns {plan.host}"
        hint = (
            f"start {host_node} (it hosts the store), give every node the same port, and check "
            f"that {plan.host} is that node's address"
        )
    elif status in ("timeout", "unreachable"):
        what = f"{plan.host} does not answer{from_here}"
        hint = (
            f"check the rendezvous address ({plan.host} must be the master node's address on a "
            f"network this node shares) and that no firewall blocks port {plan.port}"
        )
    else:
        what = detail or type(err).__name__
        hint = f"start every node with {same}, and check that {plan.endpoint} is reachable from here"
    return ShoalError(f"could not join {where} {within}: {what}", hint, exit_code=1)


def _first_line(err: BaseException) -> str:
    """The first informative line of ``err`` or of its cause (torch chains the real one)."""
    seen = err
    for _ in range(4):
        text = str(seen).strip()
        if text and "See inner exception" not in text:
            return text.splitlines()[0]
        if seen.__cause__ is None:
            break
        seen = seen.__cause__
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def is_rendezvous_failure(err: BaseException) -> bool:
    """True for what torch raises when a rendezvous cannot complete (incl. :class:`JoinFailed`)."""
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    dist_error = getattr(dist, "DistError", RuntimeError)
    return isinstance(err, (JoinFailed, NodeLeft, StoreUnreachable, RendezvousError, TimeoutError, dist_error))
