"""shoal's rendezvous backends for torch's elastic agent: ``shoal-c10d`` and ``shoal-static``.

This is the only module that touches torch's private rendezvous internals (the pickled
``_RendezvousState`` and a handler's ``_this_node``, to count the nodes that arrived); the
``tests/launch/test_torch_internals.py`` test pins them to the torch versions they were read from
and fails loudly when torch changes them.

What the backends add to torch's own rendezvous:

1. **Stores on one address.** The rendezvous store (on the node that hosts it) and the workers'
   store are served on the plan's ``shoal_bind_addr`` only (:mod:`.stores`), not on every interface.
2. **A fresh workers' store in every round**, served by that round's rank-0 node. The workers of
   every round would otherwise share one store that still holds the previous round's keys (the old
   rank 0's gloo address among them): restarted ranks then connect to dead workers and fail
   (pytorch/pytorch#135712, seen here with ``--max-restarts 1`` after a SIGKILLed worker). The
   workers connect to it as clients (``use_agent_store``): no worker process listens for a store.
3. **Arrivals counted** when joining fails (torch raises a bare ``RendezvousTimeoutError``):
   :class:`JoinFailed` carries how many nodes were there.
4. **Departures noticed**: the agent polls ``num_nodes_waiting()`` while the workers run; here that
   also checks, once a second, whether another node has closed the rendezvous (its workers failed
   and no restart is left) or the store is gone (its host died): :class:`NodeLeft` then ends this
   node at once, instead of its workers waiting for the dead ones until a collective times out.
"""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass
from typing import Any

from shoal.env.base import DEFAULT_C10D_PORT, DEFAULT_MAIN_PORT
from shoal.errors import first_line
from shoal.launch.options import parse_endpoint
from shoal.launch.rendezvous.plan import C10D_BACKEND, STATIC_BACKEND
from shoal.launch.rendezvous.stores import (
    answer_within,
    connect_store,
    serve_or_connect,
    serve_store,
    wait_for_store,
)

SHARED_STORE_OPT_OUT = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
"""Set to 1 in the launcher: torch's c10d handler then leaves serving the workers' store to shoal
(it would otherwise serve one on every interface and keep it across rounds)."""
MEMBERSHIP: dict[str, list[MembershipChange]] = {}
"""Run id -> the membership change of every round but the first, as this node saw it (read by the
launch core for its restart line)."""
ROUNDS: dict[str, Round] = {}
"""Run id -> this node's latest round (the round's store, this node's rank, the node count): the
launch core's watchdog shares its progress summary through that store."""
STOPPING: set[str] = set()
"""Run ids whose launcher stopped its workers for good (``--on-hang stop``): the agent's next
rendezvous (a restart) raises :class:`StopRequested` instead."""
_CLOSED_KEY = "shoal/closed"
_WORKERS_ADDR, _WORKERS_PORT = "shoal/workers_addr", "shoal/workers_port"
_CHECK_EVERY_S = 1.0
STORE_ANSWER_S = 30.0
"""A store request the agent makes while the workers run, unanswered this long: its host is gone."""
SHUTDOWN_ANSWER_S = 5.0
"""Closing the rendezvous at the end waits this long at most for the store (gone: nothing to close)."""


class JoinFailed(Exception):
    """The c10d rendezvous did not complete; carries what the rendezvous state showed."""

    def __init__(self, cause: BaseException, arrived: int | None, expected: int) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}".rstrip(": "))
        self.cause = cause
        self.arrived = arrived
        self.expected = expected


class NodeLeft(Exception):
    """Another node ended the job (its workers failed for good, or it lost the store)."""


class StopRequested(Exception):
    """The launcher stopped its workers for good: torch's agent must not start another attempt."""


@dataclass(frozen=True)
class Round:
    """One rendezvous round as this node joined it."""

    store: Any
    node_rank: int
    nodes: int


def _check_not_stopping(run_id: str) -> None:
    if run_id in STOPPING:
        raise StopRequested(f"the workers of {run_id} were stopped for good (--on-hang stop)")


@dataclass(frozen=True)
class MembershipChange:
    """Nodes (by address) that left and joined since the previous round, and the nodes now."""

    left: tuple[str, ...]
    joined: tuple[str, ...]
    nodes: int

    def describe(self) -> str:
        parts = []
        if self.left:
            parts.append(f"node{'s' if len(self.left) > 1 else ''} {', '.join(self.left)} left")
        if self.joined:
            parts.append(f"node{'s' if len(self.joined) > 1 else ''} {', '.join(self.joined)} joined")
        return " and ".join(parts)


def register_backends() -> None:
    """Register ``shoal-c10d`` and ``shoal-static`` with torch's rendezvous registry (idempotent)."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(C10D_BACKEND, _create_c10d_handler)
    rendezvous_handler_registry.register(STATIC_BACKEND, _create_static_handler)


class _WorkerStores:
    """One workers' store per round, served by the round's rank-0 node on the bind address."""

    def __init__(self, bind_addr: str, advertise: str, timeout: float, port: int = 0) -> None:
        self.bind_addr, self.advertise, self.timeout, self.port = bind_addr, advertise, timeout, port
        self.server: Any = None

    def publish(self, rank: int, round_store: Any) -> Any:
        """Serve (rank 0) or look up this round's workers' store; its ``RendezvousStoreInfo``."""
        from torch.distributed.elastic.rendezvous.api import RendezvousStoreInfo

        self.server = None  # the previous round's store goes away (its listener closes)
        if rank == 0:
            self.server = serve_store(self.bind_addr, self.port, timeout=self.timeout)
            round_store.set(_WORKERS_ADDR, self.advertise)
            round_store.set(_WORKERS_PORT, str(self.server.port))
        addr = round_store.get(_WORKERS_ADDR).decode()
        port = int(round_store.get(_WORKERS_PORT).decode())
        return RendezvousStoreInfo(master_addr=addr, master_port=port)


def _handler_base() -> type:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.rendezvous.api import RendezvousHandler

    class Delegating(RendezvousHandler):
        """A handler that delegates to torch's and notices when the job ended elsewhere."""

        name = ""

        def __init__(self, inner: Any, endpoint: str, workers: _WorkerStores) -> None:
            self.inner, self.endpoint, self.workers = inner, endpoint, workers
            self.next_check = 0.0

        def get_backend(self) -> str:
            return self.name

        @property
        def use_agent_store(self) -> bool:
            return True  # the workers connect to the store shoal serves for them

        def is_closed(self) -> bool:
            return self.inner.is_closed()

        def set_closed(self) -> None:
            self.inner.set_closed()

        def num_nodes_waiting(self) -> int:
            # Bounded, and waited for in Python (see answer_within): a vanished store host must not
            # hold this node, nor its SIGTERM, for as long as TCP takes to give up.
            try:
                waiting, closed = answer_within(self._poll, STORE_ANSWER_S)
            except SignalException:  # SIGTERM while waiting: the agent stops the workers
                raise
            except Exception as err:
                raise NodeLeft(
                    f"lost the rendezvous store at {self.endpoint} ({first_line(err)}): the node hosting it stopped"
                ) from None
            if closed:
                raise NodeLeft(
                    f"another node ended the job (the rendezvous at {self.endpoint} was closed): "
                    "its workers failed and could not be restarted"
                )
            return waiting

        def _poll(self) -> tuple[int, bool]:
            waiting = self.inner.num_nodes_waiting()
            closed = False
            if time.monotonic() >= self.next_check:
                self.next_check = time.monotonic() + _CHECK_EVERY_S
                closed = self.job_ended()
            return waiting, closed

        def job_ended(self) -> bool:
            return self.inner.is_closed()

        def get_run_id(self) -> str:
            return self.inner.get_run_id()

        def shutdown(self) -> bool:
            try:
                return answer_within(self.close_rendezvous, SHUTDOWN_ANSWER_S)
            except Exception:  # the store is gone or silent: nobody is left to tell
                return False

        def close_rendezvous(self) -> bool:
            return self.inner.shutdown()

        def __getattr__(self, name: str) -> Any:  # anything newer torch versions add
            return getattr(self.inner, name)

    return Delegating


def _create_c10d_handler(params: Any) -> Any:
    """torch's c10d handler over a store shoal serves (or joins); a failed join says who came.

    Connecting to the store and joining share one deadline (``shoal_deadline``): a node that starts
    before the store's host waits for it, but the whole rendezvous still fails within the join
    timeout, instead of read timeout + join timeout.
    """
    from torch.distributed.elastic.rendezvous.api import RendezvousClosedError, RendezvousTimeoutError
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    host, port = parse_endpoint(params.endpoint, DEFAULT_C10D_PORT)
    bind_addr = params.config.get("shoal_bind_addr") or host
    read_timeout = float(params.get_as_int("read_timeout", 60))
    deadline = params.config.get("shoal_deadline")
    is_host = params.get_as_bool("is_host")
    if is_host:
        store = serve_store(bind_addr, port, timeout=read_timeout)
    elif is_host is None:  # every node on this machine: the first to bind the port hosts the store
        store, _ = serve_or_connect(bind_addr, host, port, timeout=read_timeout)
    else:
        if deadline is not None and params.get_as_bool("shoal_wait_for_store", False):
            wait_for_store(host, port, deadline)
        store = connect_store(host, port, timeout=read_timeout)
    backend = C10dRendezvousBackend(store, params.run_id)
    if deadline is not None:
        params.config["join_timeout"] = max(1, int(deadline - time.monotonic()))
    inner = create_handler(store, backend, params)
    max_nodes = params.max_nodes
    workers_port = int(params.config.get("shoal_workers_port", 0))
    workers = _WorkerStores(bind_addr, params.local_addr or bind_addr, read_timeout, workers_port)

    class ShoalC10dHandler(_handler_base()):
        name = C10D_BACKEND
        members: set[str] | None = None
        """The nodes of the previous round."""

        def next_rendezvous(self) -> Any:
            from torch.distributed.elastic.rendezvous.api import RendezvousInfo

            _check_not_stopping(params.run_id)
            try:
                info = inner.next_rendezvous()
            except RendezvousClosedError as err:
                raise NodeLeft(f"the rendezvous at {params.endpoint} was closed: another node ended the job") from err
            except RendezvousTimeoutError as err:
                raise JoinFailed(err, arrived(backend, inner), max_nodes) from err
            self.note_membership(participants(backend))
            store_info = self.workers.publish(info.rank, info.store)
            ROUNDS[params.run_id] = Round(info.store, info.rank, info.world_size)
            return RendezvousInfo(info.store, info.rank, info.world_size, store_info)

        def note_membership(self, now: set[str] | None) -> None:
            if now is None:
                return
            if self.members is not None and now != self.members:
                change = MembershipChange(
                    tuple(sorted(self.members - now)), tuple(sorted(now - self.members)), len(now)
                )
                MEMBERSHIP.setdefault(params.run_id, []).append(change)
            self.members = now

    MEMBERSHIP.pop(params.run_id, None)
    ROUNDS.pop(params.run_id, None)
    return ShoalC10dHandler(inner, params.endpoint, workers)


def _rendezvous_state(backend: Any) -> Any:
    """torch's rendezvous state (a pickled ``_RendezvousState``) as the store holds it, or None
    before the first round; raises on another layout (tests/launch/test_torch_internals.py) or
    when the store is gone."""
    got = backend.get_state()
    return pickle.loads(got[0]) if got is not None else None


def participants(backend: Any) -> set[str] | None:
    """The addresses of the nodes in the round just formed, or None if unknown."""
    try:
        state = _rendezvous_state(backend)
        return {node.addr for node in state.participants} if state is not None else None
    except Exception:
        return None


def arrived(backend: Any, inner: Any) -> int | None:
    """Nodes in the rendezvous (participants and waiting), this one included; None if unknown.

    Reads torch's rendezvous state (a pickled ``_RendezvousState``); at the deadline torch has
    already taken this node out again, so it is counted back in.
    """
    try:
        state = _rendezvous_state(backend)
        if state is None:
            return 1
        me = getattr(inner, "_this_node", None)
        others = {n for n in (*state.participants, *state.wait_list) if n != me}
        return len(others) + 1
    except Exception:  # a torch version with another state layout, or the store is gone
        return None


def _create_static_handler(params: Any) -> Any:
    """Fixed node ranks; node 0 serves the store and waits there for every node to connect.

    torch's own static handler serves its store on every interface and hands the workers that
    same store in every round; this one serves on the bind address, and gives each round its key
    prefix and a fresh workers' store. Every node's agent counts rounds the same way: one rendezvous
    per (re)start of its workers. Static has no shared state but the store: a node that ends the job
    sets a key in it, which the others see; if node 0 ends, the store itself is gone.
    """
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous.api import RendezvousInfo

    host, port = parse_endpoint(params.endpoint, DEFAULT_MAIN_PORT)
    rank = int(params.config["rank"])
    world_size = params.max_nodes
    timeout = float(params.config.get("timeout", 600))
    deadline = params.config.get("shoal_deadline")
    bind_addr = params.config.get("shoal_bind_addr") or host
    workers = _WorkerStores(bind_addr, params.local_addr or bind_addr, timeout)

    class ShoalStaticHandler(_handler_base()):
        name = STATIC_BACKEND
        round = 0
        store: Any = None

        def next_rendezvous(self) -> Any:
            _check_not_stopping(params.run_id)
            if self.store is None:
                self.store = self._connect()
            round_store = dist.PrefixStore(f"{params.run_id}/round{self.round}/", self.store)
            self.round += 1
            info = RendezvousInfo(round_store, rank, world_size, self.workers.publish(rank, round_store))
            ROUNDS[params.run_id] = Round(round_store, rank, world_size)
            return info

        def _connect(self) -> Any:
            remaining = timeout if deadline is None else max(1.0, deadline - time.monotonic())
            if rank == 0:  # waits until every node has connected ("N/M clients joined" otherwise)
                return serve_store(bind_addr, port, timeout=remaining, world_size=world_size, wait=True)
            if deadline is not None and params.get_as_bool("shoal_wait_for_store", False):
                wait_for_store(host, port, deadline)
                remaining = max(1.0, deadline - time.monotonic())
            return connect_store(host, port, timeout=remaining, world_size=world_size, wait=True)

        def is_closed(self) -> bool:
            return False

        def set_closed(self) -> None:
            pass

        def job_ended(self) -> bool:
            return self.store is not None and self.store.check([_CLOSED_KEY])

        def get_run_id(self) -> str:
            return params.run_id

        def close_rendezvous(self) -> bool:
            if self.store is not None:
                try:
                    self.store.set(_CLOSED_KEY, "1")
                except Exception:  # node 0 (the store) is gone already
                    pass
            return True

    ROUNDS.pop(params.run_id, None)
    return ShoalStaticHandler(_NoInner(), params.endpoint, workers)


class _NoInner:
    """The static handler has no torch handler inside: nothing waits, nothing is closed."""

    def num_nodes_waiting(self) -> int:
        return 0

    def is_closed(self) -> bool:
        return False
