"""``TF_CONFIG`` for TensorFlow's own engine (``tf.distribute.MultiWorkerMirroredStrategy``), made
where shoal starts each worker.

A native TF script reads ``TF_CONFIG``: every worker's ``host:port`` and its own index. Opt-in with
``SHOAL_TF_CONFIG=1`` (``shoal run --tf-config`` sets it for its workers; ``shoal launch --env
SHOAL_TF_CONFIG=1`` hands it to every process of every target); without it nothing here runs and
nothing is imported. :func:`add_tf_config` is called right before a worker's command starts, by
:mod:`shoal.launch.worker_shim` (``shoal run``'s workers, under torch's agent) and by
:func:`shoal.launch.as_torchrun.environment_for` (each mpirun or srun rank). Each worker:

1. finds its address the way the rest of the job does (the rendezvous plan's rule, :func:`advertised_address`):
   the address of the interface in ``GLOO_SOCKET_IFNAME`` (which ``shoal run`` sets to the interface
   toward the master), else the kernel's source address toward ``MASTER_ADDR``
   (:func:`shoal.env.network.route_to`; on the master's own node, its address on the other nodes' way);
2. reserves a port (:func:`reserve_port`);
3. publishes ``host:port`` under its ``RANK`` in a store that already exists, and reads every other
   rank's: under torch's agent, the workers' store the agent serves at ``MASTER_ADDR:MASTER_PORT``;
   under mpirun or srun, where nothing listens there before the script, a store rank 0 serves there
   (on its address toward the master only) until every rank has read the list;
4. releases its port and gets ``TF_CONFIG``: ``{"cluster": {"worker": [...]}, "task": {"type":
   "worker", "index": RANK}}``.

The port is released right before the command starts, not held across ``exec``: TF's gRPC server
turns ``SO_REUSEPORT`` off (``NoReusePortOption`` in tensorflow/core/distributed_runtime/rpc/
grpc_server_lib.cc), so it cannot bind a port another socket still holds. Two things keep the gap
between release and TF's bind safe: the port is taken outside the kernel's ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``), so no outgoing connection (TF's own gRPC clients
included) is handed it meanwhile; and every worker holds its port until every worker has published
its own, so two workers of one machine never get the same one. TF then listens on every interface
(its choice); the address in ``TF_CONFIG`` is shoal's.

Imports torch (its ``TCPStore``) only when asked; the TF script itself need not import torch. The
rest is imported where used, too: every mpirun or srun rank and every ``shoal run`` worker imports
this module before its command starts, asked or not.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, MutableMapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from shoal.errors import ShoalError, first_line
from shoal.launch.exit_hook import switch

if TYPE_CHECKING:
    from shoal.launch.options import LaunchOptions

ENV = "SHOAL_TF_CONFIG"
"""``1`` (or on/true/yes): the workers get ``TF_CONFIG``; removed before the command starts."""
TF_CONFIG = "TF_CONFIG"
DEFAULT_TIMEOUT_S = 60.0
"""How long a worker waits for the others' addresses (``SHOAL_INIT_TIMEOUT`` overrides it)."""
_PREFIX = "shoal/tf_config"
_PORT_FLOOR = 20000
"""Reserved ports come from here up to the ephemeral range's start (32768 by default)."""
_TRIES = 64
_HINT_ENV = f"set {ENV}=1 (or pass shoal run --tf-config) to get TF_CONFIG; {ENV}=0 or unset for none"


def requested(environ: Mapping[str, str]) -> bool:
    """True if ``environ`` asks for ``TF_CONFIG`` (``SHOAL_TF_CONFIG=1``); ShoalError for a value
    that is neither on nor off."""
    return switch(environ, ENV, _HINT_ENV)


def check_layout(options: LaunchOptions, environ: Mapping[str, str]) -> None:
    """Refuse, before anything starts, a ``shoal run --tf-config`` job TF cannot be told about."""
    if ENV in environ and not requested(environ):
        raise ShoalError(
            f"--tf-config asks for TF_CONFIG, but {ENV}={environ[ENV]} here says not to",
            f"unset {ENV}, or drop --tf-config",
        )
    if TF_CONFIG in environ:
        raise ShoalError(
            f"TF_CONFIG is already set here and --tf-config ({ENV}=1) would replace it in every worker",
            "unset TF_CONFIG to let shoal write it, or drop --tf-config to keep yours",
        )
    low, high = options.node_counts
    if low != high:
        raise ShoalError(
            f"--tf-config with --nnodes {options.nnodes}: MultiWorkerMirroredStrategy's cluster is fixed "
            "when it starts, so nodes cannot come and go",
            "give a fixed node count (--nnodes N)",
        )


def add_tf_config(environ: MutableMapping[str, str], *, serve: bool) -> None:
    """Set ``TF_CONFIG`` in ``environ`` (a worker's, torchrun's variables in it) when it asks for
    one; call it right before the worker's command starts. ``SHOAL_TF_CONFIG`` is removed either way.

    ``serve``: rank 0 serves the exchange's store at ``MASTER_ADDR:MASTER_PORT`` (mpirun, srun);
    False: a store already listens there (torch's agent serves the workers' store).

    Raises:
        ShoalError: ``TF_CONFIG`` already set, the variables missing, the store's port taken, or a
            rank whose address did not arrive in time.
    """
    if not requested(environ):
        environ.pop(ENV, None)
        return
    del environ[ENV]
    if TF_CONFIG in environ:
        raise ShoalError(
            f"TF_CONFIG is already set, and {ENV}=1 asks shoal to write it",
            f"unset TF_CONFIG to let shoal write it, or unset {ENV} to keep yours",
        )
    from shoal.env.detect import detect_environment
    from shoal.env.network import bracket, route_to

    # torchrun's variables, exactly as the command will see them (both callers have set them).
    info = detect_environment(environ, forced="torchrun", argv=[])
    timeout = float(environ.get("SHOAL_INIT_TIMEOUT") or DEFAULT_TIMEOUT_S)
    route = route_to(info.main_address)
    addr = advertised_address(environ, route.addr)
    # On the master's node the store listens on the route's address (the master's name may
    # resolve to loopback there); elsewhere, MASTER_ADDR as every node resolves it.
    store_host = route.addr if route.master_is_local else route.master_ip
    serving = serve and info.rank == 0
    port = reserve_port(addr)
    try:
        store = _open_store(store_host, info.main_port, serve=serving, timeout=timeout)
        mine = f"{bracket(addr)}:{port.getsockname()[1]}"
        # One key space per store: a restart's round serves a fresh workers' store.
        workers = exchange(store, _PREFIX, info.rank, info.world_size, mine, timeout)
        if serving:  # the others may still be reading: the store goes once the last has read
            store.wait([f"{_PREFIX}/done"], timedelta(seconds=timeout))
        del store
    except RuntimeError as err:  # torch's DistError family: a rank or the store went away meanwhile
        raise ShoalError(
            f"TF_CONFIG: rank {info.rank}'s exchange at {bracket(store_host)}:{info.main_port} failed: {first_line(err)}",
            "another rank failed or stopped first (see its own output); wait longer with SHOAL_INIT_TIMEOUT",
            exit_code=1,
        ) from None
    finally:
        port.close()  # released right before the command starts: see the module's docstring
    environ[TF_CONFIG] = tf_config(workers, info.rank)


def tf_config(workers: list[str], index: int) -> str:
    """The ``TF_CONFIG`` JSON of worker ``index`` among ``workers`` (``host:port`` in rank order)."""
    import json

    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})


def advertised_address(environ: Mapping[str, str], route_addr: str) -> str:
    """This worker's address for the other workers: the IPv4 address of the interface named in
    ``GLOO_SOCKET_IFNAME`` (shoal run sets it to the one toward the master; yours wins), else
    ``route_addr`` (the source address toward the master)."""
    from shoal.env.network import interface_addresses

    named = environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0].strip()
    if named:
        for addr in interface_addresses().get(named, []):
            if ":" not in addr:
                return addr
    return route_addr


def reserve_port(addr: str) -> socket.socket:
    """A socket bound to a free port on every interface (TF listens on every interface), below the
    kernel's ephemeral range; the caller closes it right before TF binds the port."""
    import random

    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    low = _ephemeral_start()
    candidates = random.sample(range(_PORT_FLOOR, low), min(_TRIES, low - _PORT_FLOOR)) if low > _PORT_FLOOR else []
    for port in [*candidates, 0]:  # 0: the kernel's choice, when every candidate is taken
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
            return sock
        except OSError:
            sock.close()
    raise ShoalError("no free TCP port for TensorFlow's server on this machine", "free some ports and run again")


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def exchange(store: Any, prefix: str, rank: int, world: int, mine: str, timeout: float) -> list[str]:
    """Publish ``mine`` as ``rank``'s entry; every rank's entry, in rank order, once all are there.

    Each rank then counts itself as done; the last sets ``<prefix>/done`` (what a serving rank 0
    waits for before its store may go).
    """
    store.set(f"{prefix}/{rank}", mine)
    keys = [f"{prefix}/{r}" for r in range(world)]
    try:
        store.wait(keys, timedelta(seconds=timeout))
    except RuntimeError:  # torch raises DistStoreError (a RuntimeError) on timeout
        missing = [str(r) for r, key in enumerate(keys) if not store.check([key])]
        raise ShoalError(
            f"TF_CONFIG: rank {rank} waited {timeout:g} s for the addresses of ranks {', '.join(missing)} of {world}",
            "every rank must start with SHOAL_TF_CONFIG=1 and reach MASTER_ADDR:MASTER_PORT; wait longer with SHOAL_INIT_TIMEOUT",
            exit_code=1,
        ) from None
    workers = [store.get(key).decode() for key in keys]
    if len(set(workers)) != world:  # cannot happen while ports are held until all have published
        raise ShoalError(f"TF_CONFIG: two ranks got the same address: {workers}", "run again", exit_code=1)
    if store.add(f"{prefix}/read", 1) == world:
        store.set(f"{prefix}/done", "1")
    return workers


def _open_store(host: str, port: int, *, serve: bool, timeout: float) -> Any:
    """The exchange's store: served here on ``host:port`` (rank 0 under mpirun or srun), or a
    client of the one there."""
    from shoal.env.network import bracket
    from shoal.launch.rendezvous.stores import connect_store, serve_store

    where = f"{bracket(host)}:{port}"
    if serve:
        try:
            return serve_store(host, port, timeout=timeout)
        except OSError as err:
            raise ShoalError(
                f"TF_CONFIG: rank 0 cannot listen on {where}: {err.strerror}",
                "give the job a free MASTER_PORT (shoal launch --master-port PORT)",
            ) from None
    try:
        return connect_store(host, port, timeout=timeout)
    except RuntimeError as err:  # torch's DistNetworkError / DistStoreError
        raise ShoalError(
            f"TF_CONFIG: cannot reach the store at {where} in {timeout:g} s ({err.__class__.__name__})",
            "check that rank 0 runs and that MASTER_ADDR:MASTER_PORT is reachable from this node",
            exit_code=1,
        ) from None
