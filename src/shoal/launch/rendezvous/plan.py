"""The rendezvous plan: what this node decides before anything starts, as a pure function.

:func:`plan_rendezvous` takes the options, the route to the master (found beforehand with
:func:`shoal.env.network.route_to`), the launcher's environment and the clock, and returns a frozen
:class:`RendezvousPlan`; it changes nothing. It decides, unless the user already did:

- the interface and address on the way to the master: ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``
  for the workers, and the agent's ``local_addr``, which torch otherwise takes from
  ``socket.getfqdn()`` (often a name for 127.0.0.1);
- the one address every listening socket of the job binds (:attr:`RendezvousPlan.bind_addr`): the
  rendezvous store, the workers' store and gloo's sockets (through the interface name). On one node
  that is 127.0.0.1; across nodes, this node's address on the link to the master. torch binds its
  stores to every interface, and its stores have no authentication (docs/SECURITY.md);
- for c10d, whether this node hosts the store (``is_host``): the node that owns the endpoint's
  address does. torch guesses from the hostname, which fails whenever the endpoint is an IP address
  and the hostname resolves to loopback: then nobody hosts it and every node waits in vain;
- timeouts from ``--join-timeout``: torch's defaults are 900 s (static), and for c10d 600 s to join
  plus 60 s per store operation, so a typo in an address costs a quarter of an hour.

A single node gets a plan too: c10d on 127.0.0.1, port 0 (the OS picks a free one, and nothing is
closed and re-bound later, so no other job can take it in between).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shoal.env.base import DEFAULT_C10D_PORT, DEFAULT_MAIN_PORT, LOOPBACK
from shoal.env.network import Route, bracket
from shoal.errors import ShoalError
from shoal.launch.options import LaunchOptions, parse_bool, parse_endpoint

SOCKET_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
C10D_BACKEND = "shoal-c10d"
"""torch's c10d rendezvous, registered under shoal's name (see :mod:`.handlers`)."""
STATIC_BACKEND = "shoal-static"
"""shoal's static rendezvous (see :mod:`.handlers`)."""
LAST_CALL_S = 5
"""c10d: how long a rendezvous that has MIN nodes waits for more (torch: 30 s)."""
KEEP_ALIVE_S, KEEP_ALIVE_MISSES = 2, 3
"""c10d: heartbeat interval and how many may be missed before a node counts as gone (6 s; torch 15 s)."""
MANY_NODES, MANY_NODES_KEEP_ALIVE_S = 8, 5
"""c10d above ``MANY_NODES`` nodes: a heartbeat every 5 s (torch's default), a lost node noticed in 15 s.
torch's c10d rendezvous keeps every node in one pickled state that each heartbeat reads and rewrites
whole (a compare-and-set, retried when another node wrote first): the store's traffic grows with
nodes x heartbeats/s x state size (measured: ``python -m benchmarks.rendezvous_scale``, docs/BENCHMARKS.md,
"Rendezvous at 1,000 simulated nodes"). And while nodes join, any node whose last heartbeat is older
than interval x misses is dropped by the next node to write: with 2 s x 3 (6 s) and launchers short
of CPU, live nodes were dropped faster than they joined. 16 real nodes (one 2-core machine) did not
close in 600 s with 2 s heartbeats, and closed with 5 s in the same run; 2 and 8 nodes closed with 2 s
(benchmarks/scale_curves.py, docs/BENCHMARKS.md, "Cost curves to 16 nodes")."""
EXIT_MARGIN_S = 2.0
"""torch overshoots its own timeouts a little and the failure is then diagnosed (one TCP probe of at
most 1 s): this much of the join budget is kept for that."""


@dataclass(frozen=True)
class RendezvousPlan:
    """What this node decided; :meth:`lines` explains it at start-up."""

    backend: str
    """``static`` or ``c10d``."""
    host: str
    """The rendezvous store's host as every node reaches it."""
    port: int
    """Its port (0 on a single node: the OS picks one)."""
    min_nodes: int
    max_nodes: int
    nnodes: str
    node_rank: int
    run_id: str
    join_timeout: float
    route: Route | None
    """How this node reaches the master (None on a single node)."""
    local_addr: str
    """This node's address as the other nodes reach it."""
    bind_addr: str
    """Where this node's listening sockets go (stores; gloo through :attr:`bind_ifname`)."""
    bind_ifname: str | None
    is_host: bool | None
    """c10d: whether this node hosts the store (None: the first node here to bind it does)."""
    hosts_store: bool
    """This node serves the rendezvous store (static node 0, the c10d host, or a single node)."""
    rdzv_configs: Mapping[str, Any]
    """Settings for the rendezvous handler (torch's and shoal's keys)."""
    environ: Mapping[str, str]
    """Variables to set for the workers (none the user already set)."""
    user_ifnames: Mapping[str, str] = field(default_factory=dict)
    """``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` as the user set them."""
    warnings: tuple[str, ...] = ()
    scale_note: str | None = None
    """A setting chosen for this many nodes that differs from the one for a few (said at start)."""
    workers_port: int = 0
    """The port of the workers' store (their MASTER_PORT) on a single node; 0: the OS picks."""

    @property
    def single_node(self) -> bool:
        return self.route is None

    @property
    def nodes_here(self) -> int:
        """Nodes whose workers share this machine's cores: every node (at most) when the master is a
        loopback address, since every node must then run here; else this one alone. A master address
        of this machine that is not loopback says nothing of the other nodes: on a cluster node 0
        hosts the rendezvous and the others run elsewhere, on their own cores."""
        return self.max_nodes if self.route is not None and self.route.loopback else 1

    @property
    def endpoint(self) -> str:
        return f"{bracket(self.host)}:{self.port}"

    @property
    def launch_backend(self) -> str:
        """The backend name given to torch's launcher: shoal's handlers (see :mod:`.handlers`)."""
        return STATIC_BACKEND if self.backend == "static" else C10D_BACKEND

    def listening(self) -> dict[str, Any]:
        """What a job started with this plan listens on, on this node (``shoal env``, docs/SECURITY.md)."""
        free = "a port the OS picks"
        return {
            "address": self.bind_addr,
            "interface": self.bind_ifname,
            "rendezvous_store": (self.port or free) if self.hosts_store else None,
            "workers_store": (self.workers_port or free)
            if self.single_node or self.hosts_store
            else "on rank 0's node",
            "collectives": f"gloo/NCCL sockets on {self.bind_ifname or self.bind_addr}, ports the OS picks",
        }

    def lines(self, prog: str, nproc: int, extra: str = "") -> list[str]:
        """Start-up lines of a multi-node launch: what this node waits for, the network choices and why."""
        workers = f"{nproc} worker{'s' if nproc != 1 else ''}"
        node = f"node {self.node_rank} of {self.max_nodes}" if self.backend == "static" else f"--nnodes {self.nnodes}"
        first = (
            f"{prog}: {workers} on this node ({node}), waiting for the {self.backend} rendezvous at "
            f"{self.endpoint} (join timeout {self.join_timeout:g} s){extra}"
        )
        scale = [f"{prog}: {self.scale_note}"] if self.scale_note else []
        return [first, self.network_line(prog), *scale, *(f"{prog}: warning: {w}" for w in self.warnings)]

    def network_line(self, prog: str) -> str:
        parts = []
        if self.route is not None:
            via = f" on {self.route.ifname}" if self.route.ifname else ""
            parts.append(f"advertising {self.local_addr}{via} ({self.route.why})")
        ifnames = [f"{k}={v}" for k, v in self.environ.items() if k in SOCKET_IFNAME_VARS]
        ifnames += [f"{k}={v} (yours)" for k, v in self.user_ifnames.items()]
        if ifnames:
            parts.append(", ".join(ifnames))
        if self.backend == "c10d":
            if self.is_host:
                parts.append("this node hosts the c10d store")
            elif self.is_host is False:
                parts.append(f"the c10d store is hosted by {self.host}")
        parts.append(f"listening on {self.bind_addr} only")
        return f"{prog}: network: " + "; ".join(parts)


def single_node_plan(options: LaunchOptions, environ: Mapping[str, str]) -> RendezvousPlan:
    """Every worker on this machine: c10d on 127.0.0.1, every socket on loopback.

    The workers' store (their MASTER_PORT) listens on the port the user named (``--master-port``,
    or the one in ``--rdzv-endpoint``), else on one the OS picks; the agent's own rendezvous store
    always on one the OS picks.
    """
    user_ifnames = {k: environ[k] for k in SOCKET_IFNAME_VARS if environ.get(k)}
    env = {k: "lo" for k in SOCKET_IFNAME_VARS if k not in user_ifnames}
    port = options.master_port or 0
    if options.rdzv_endpoint:
        port = parse_endpoint(options.rdzv_endpoint, port)[1]
    configs = {"is_host": True, "shoal_bind_addr": LOOPBACK, "shoal_workers_port": port}
    configs["join_timeout"] = int(options.join_timeout)
    return RendezvousPlan(
        backend="c10d", host=LOOPBACK, port=0, min_nodes=1, max_nodes=1, nnodes="1", node_rank=0,
        run_id=options.rdzv_id, join_timeout=options.join_timeout, route=None, local_addr=LOOPBACK,
        bind_addr=LOOPBACK, bind_ifname="lo", is_host=True, hosts_store=True, rdzv_configs=configs,
        environ=env, user_ifnames=user_ifnames, workers_port=port,
    )  # fmt: skip


def store_endpoint(options: LaunchOptions) -> tuple[str, int]:
    """(host, port) of the rendezvous store the options name (ShoalError if they name none)."""
    if options.rdzv_backend == "static":
        if options.rdzv_endpoint:
            return parse_endpoint(options.rdzv_endpoint, DEFAULT_MAIN_PORT)
        port = options.master_port if options.master_port is not None else DEFAULT_MAIN_PORT
        return options.master_addr or LOOPBACK, port
    if options.rdzv_endpoint:
        return parse_endpoint(options.rdzv_endpoint, DEFAULT_C10D_PORT)
    if options.master_addr:  # as with static: the master hosts the store
        return options.master_addr, options.master_port or DEFAULT_C10D_PORT
    raise ShoalError(
        f"--rdzv-backend {options.rdzv_backend} needs --rdzv-endpoint HOST:PORT",
        "give the address of one of the nodes (it hosts the store) and a free port, the same on every "
        "node, e.g. --rdzv-endpoint 10.0.0.1:29400",
    )


def plan_rendezvous(
    options: LaunchOptions,
    route: Route,
    environ: Mapping[str, str],
    *,
    now: float,
    spent: float = 0.0,
    interface_address: Mapping[str, str] | None = None,
) -> RendezvousPlan:
    """Decide interface, addresses, store host and timeouts for one node of a multi-node job.

    Args:
        options: what the user asked for (``options.several_nodes`` is true).
        route: how this node reaches the store's host (``route_to(store_endpoint(options)[0])``).
        environ: the launcher's environment: variables set there win.
        now: ``time.monotonic()`` now; deadlines handed to the handlers are measured from it.
        spent: seconds of the join timeout already spent (``shoal run`` counts from its own start,
            so the command as a whole gives up after ``--join-timeout`` seconds, torch's import
            included).
        interface_address: the IPv4 address of each interface the user named in
            ``GLOO_SOCKET_IFNAME`` (where this node then listens).
    """
    host, port = store_endpoint(options)
    min_nodes, max_nodes = options.node_counts
    static = options.rdzv_backend == "static"
    local_addr = options.local_addr or route.addr
    warnings: list[str] = []
    is_host, hosts_store = _store_host(options, route, host, warnings)
    timeout = max(1, int(options.join_timeout - spent - EXIT_MARGIN_S))
    configs, scale_note = _rdzv_timeouts(options, timeout, max_nodes)
    if is_host is not None:
        configs["is_host"] = is_host
    # A node that connects to another's store waits for it in Python until the deadline: torch's
    # store client may sleep a back-off of several seconds past its own timeout.
    connect_timeout = configs["timeout" if static else "join_timeout"]
    configs["shoal_deadline"] = now + connect_timeout
    configs["shoal_wait_for_store"] = not hosts_store and not route.loopback
    for key, value in options.conf.items():
        configs.setdefault(key, value)

    env, user_ifnames = _socket_interfaces(route, environ, local_addr, warnings)
    bind_ifname = user_ifnames.get("GLOO_SOCKET_IFNAME") or route.ifname
    bind_addr = options.local_addr or (interface_address or {}).get(bind_ifname or "") or route.addr
    configs["shoal_bind_addr"] = bind_addr
    if "SHOAL_INIT_TIMEOUT" not in environ:  # shoal.init()'s own join timeout, in the workers
        env["SHOAL_INIT_TIMEOUT"] = f"{options.join_timeout:g}"
    return RendezvousPlan(
        backend=options.rdzv_backend, host=host, port=port, min_nodes=min_nodes, max_nodes=max_nodes,
        nnodes=options.nnodes, node_rank=options.node_rank, run_id=options.rdzv_id,
        join_timeout=options.join_timeout, route=route, local_addr=local_addr, bind_addr=bind_addr,
        bind_ifname=bind_ifname, is_host=is_host, hosts_store=hosts_store, rdzv_configs=configs,
        environ=env, user_ifnames=user_ifnames, warnings=tuple(warnings), scale_note=scale_note,
    )  # fmt: skip


def _store_host(options: LaunchOptions, route: Route, host: str, warnings: list[str]) -> tuple[bool | None, bool]:
    """Who hosts the store: c10d's ``is_host`` for torch (None: torch decides, the first node to bind
    the port), and whether this node does. Static: node rank 0, warned when ``host`` is not its own."""
    if options.rdzv_backend == "static":
        hosts_store = options.node_rank == 0
        if hosts_store and not route.master_is_local:
            warnings.append(
                f"this is node rank 0, which hosts the store, but {host} is not one of its addresses: "
                "the other nodes will look for the store there (right only behind a NAT or a "
                "service name; otherwise give node 0's own address as --master-addr)"
            )
        return None, hosts_store
    is_host: bool | None = None
    if "is_host" in options.conf:
        is_host = parse_bool("is_host", options.conf["is_host"])
    elif not route.loopback:  # loopback: every node is here; the first to bind the port hosts it
        is_host = route.master_is_local
    return is_host, bool(is_host)


def _rdzv_timeouts(options: LaunchOptions, timeout: int, max_nodes: int) -> tuple[dict[str, Any], str | None]:
    """The rendezvous' timeouts for torch's handler (the user's ``--rdzv-conf`` wins), from the join
    timeout left (``timeout``); and the start-up note on the heartbeat chosen for the job's size."""
    conf = options.conf
    if options.rdzv_backend == "static":
        return {"rank": options.node_rank, "timeout": int(conf.get("timeout", timeout))}, None
    configs: dict[str, Any] = {
        "join_timeout": int(conf.get("join_timeout", timeout)),
        "read_timeout": int(conf.get("read_timeout", min(timeout, 60))),
        # Once MIN nodes are in, torch waits last_call (30 s) for more. Shorter here: a lost node
        # costs the survivors this wait in every re-rendezvous, while a node that comes later
        # still joins, at the next membership change (one more restart of every node's workers).
        "last_call_timeout": int(conf.get("last_call_timeout", max(1, min(LAST_CALL_S, timeout // 2)))),
    }
    # A node is declared gone after keep_alive_interval x keep_alive_max_attempt without a
    # heartbeat (torch: 5 s x 3); every node writes one heartbeat per interval to the store.
    keep_alive, scale_note = keep_alive_for(max_nodes)
    if "keep_alive_interval" in conf:
        scale_note = None  # the user's setting: nothing chosen for them
    configs["keep_alive_interval"] = int(conf.get("keep_alive_interval", keep_alive))
    configs["keep_alive_max_attempt"] = int(conf.get("keep_alive_max_attempt", KEEP_ALIVE_MISSES))
    return configs, scale_note


def _socket_interfaces(
    route: Route, environ: Mapping[str, str], local_addr: str, warnings: list[str]
) -> tuple[dict[str, str], dict[str, str]]:
    """The workers' socket interface variables (``GLOO_SOCKET_IFNAME``...: the route's interface,
    where the user set none), and those the user set; warned when neither names one."""
    env: dict[str, str] = {}
    user_ifnames = {k: environ[k] for k in SOCKET_IFNAME_VARS if environ.get(k)}
    if route.ifname:
        env.update({k: route.ifname for k in SOCKET_IFNAME_VARS if k not in user_ifnames})
    elif not user_ifnames:
        warnings.append(
            f"no interface found for {local_addr}: set GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME) "
            "to the interface the nodes share"
        )
    return env, user_ifnames


def keep_alive_for(max_nodes: int) -> tuple[int, str | None]:
    """c10d's heartbeat interval for a job of up to ``max_nodes`` nodes, and the start-up note when it
    is not the few-node one (see :data:`MANY_NODES`)."""
    if max_nodes <= MANY_NODES:
        return KEEP_ALIVE_S, None
    s = MANY_NODES_KEEP_ALIVE_S
    return s, (
        f"{max_nodes} nodes: c10d heartbeats every {s} s, not {KEEP_ALIVE_S} s (each one rewrites the whole "
        f"rendezvous state in the store), so a lost node is noticed after {s * KEEP_ALIVE_MISSES} s; "
        "at this size the static rendezvous costs the store far less (docs/MULTINODE.md)"
    )
