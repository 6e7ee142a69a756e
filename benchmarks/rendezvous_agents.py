"""Simulated nodes for :mod:`benchmarks.rendezvous_scale`: torch's own elastic agent and rendezvous
handlers, one thread per node, no workers.

``python -m benchmarks.rendezvous_agents SPEC_JSON`` runs the agents ``first .. first + count - 1`` of
one simulated job in this process. Each is torch's ``SimpleElasticAgent`` (the base of the
``LocalElasticAgent`` that torchrun and ``shoal run`` start) with its worker hooks stubbed, so no
process starts; its own ``run()`` does what a node's agent does: ``next_rendezvous`` (join), the
rank assignment over the store, the monitoring loop (``num_nodes_waiting`` every monitor interval)
while the handler's keep-alive thread heartbeats, the exit barrier; then, as torch's
``launch_agent`` does, the handler's ``shutdown``. The handler is shoal's (``shoal-c10d`` or
``shoal-static``, from the rendezvous plan, as ``shoal run`` makes it) or torch's own (the dynamic
``c10d`` handler, ``static``) with torch's defaults.

Every node's store client is wrapped in :class:`CountingStore`, a ``torch.distributed.Store``
subclass that forwards each call to the real ``TCPStore`` client and counts it with its bytes,
whether it comes from Python or through a ``PrefixStore`` in C++. Not counted: what ``TCPStore``'s
constructor itself sends (a validation and, with a world size, one ``add``): one ``connect`` each.

The parent drives the phases through stdin, a word a line: ``go`` (the nodes start and join),
``mark`` (report the counters), ``kill I`` (node I dies: its heartbeats stop, it never leaves),
``fail`` (the other nodes' workers fail, as they do in their next collective after a peer died:
a restart, hence a re-rendezvous), ``finish`` (the workers succeed: exit barrier, shutdown). It
answers with JSON lines on stdout.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
EXIT_BARRIER_S = 300
"""torch's ``LocalElasticAgent`` default (shoal keeps it)."""
TORCH_CONFIGS = {"timeout": 900}
"""What torch's ``LaunchConfig`` puts in every launch's rendezvous settings (shoal's plan updates it)."""
TORCH_READ_TIMEOUT_S = 60


def _say(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _store_class() -> type:
    import torch.distributed as dist

    class CountingStore(dist.Store):
        """A store client that counts every request (and its bytes) before forwarding it."""

        def __init__(self, inner: Any, counts: Counter) -> None:
            super().__init__()
            self.inner, self.counts = inner, counts
            self.counts["connect"] += 1

        def _n(self, op: str, nbytes: int = 0) -> None:
            self.counts[op] += 1
            self.counts["bytes"] += nbytes

        def set(self, key, value):
            self._n("set", len(key) + len(value))
            return self.inner.set(key, value)

        def get(self, key):
            value = self.inner.get(key)
            self._n("get", len(key) + len(value))
            return value

        def add(self, key, value):
            self._n("add", len(key) + 8)
            return self.inner.add(key, value)

        def compare_set(self, key, expected, desired):
            value = self.inner.compare_set(key, expected, desired)
            self._n("compare_set", len(key) + len(expected) + len(desired) + len(value))
            return value

        def check(self, keys):
            self._n("check", sum(map(len, keys)))
            return self.inner.check(keys)

        def wait(self, keys, timeout=None):
            self._n("wait", sum(map(len, keys)))
            return self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)

        def multi_get(self, keys):
            values = self.inner.multi_get(keys)
            self._n("multi_get", sum(map(len, keys)) + sum(map(len, values)))
            return values

        def multi_set(self, keys, values):
            self._n("multi_set", sum(map(len, keys)) + sum(map(len, values)))
            return self.inner.multi_set(keys, values)

        def delete_key(self, key):
            self._n("delete_key", len(key))
            return self.inner.delete_key(key)

        def num_keys(self):
            self._n("num_keys")
            return self.inner.num_keys()

        def append(self, key, value):
            self._n("append", len(key) + len(value))
            return self.inner.append(key, value)

        def has_extended_api(self):
            return True

    return CountingStore


@dataclass
class Node:
    """One simulated node: its counters and what happened when (``time.time()``)."""

    index: int
    counts: Counter = field(default_factory=Counter)
    store: Any = None
    handler: Any = None
    started: list[float] = field(default_factory=list)
    world: list[int] = field(default_factory=list)
    at_start: list[dict[str, int]] = field(default_factory=list)
    exit_done: float | None = None
    shutdown_done: float | None = None
    error: str | None = None
    fail: threading.Event = field(default_factory=threading.Event)
    killed: threading.Event = field(default_factory=threading.Event)

    def record(self) -> dict[str, Any]:
        return {
            "index": self.index, "started": self.started, "world": self.world, "at_start": self.at_start,
            "exit_done": self.exit_done, "shutdown_done": self.shutdown_done, "error": self.error,
            "counts": dict(self.counts), "killed": self.killed.is_set(),
        }  # fmt: skip


class Simulation:
    """The nodes of this process and the phases the parent drives."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.nodes = [Node(i) for i in range(spec["first"], spec["first"] + spec["count"])]
        self.finish = threading.Event()
        self.end = threading.Event()
        self.lock = threading.Lock()
        self.reported_rounds = 0
        self.go_at = time.time()
        self.local = threading.local()
        self.counting = _store_class()

    # -- stores, counted ------------------------------------------------------------------------

    def wrap(self, store: Any) -> Any:
        """The node of this thread gets its first store wrapped (later ones: a workers' store)."""
        node: Node = self.local.node
        if node.store is not None:
            return store
        node.store = self.counting(store, node.counts)
        return node.store

    def patch_shoal(self) -> None:
        """shoal's handlers make their store with these three functions: count what they return."""
        from shoal.launch.rendezvous import handlers

        for name in ("serve_store", "connect_store"):
            real = getattr(handlers, name)
            setattr(handlers, name, lambda *a, _real=real, **k: self.wrap(_real(*a, **k)))
        real_soc = handlers.serve_or_connect
        handlers.serve_or_connect = lambda *a, **k: (lambda pair: (self.wrap(pair[0]), pair[1]))(real_soc(*a, **k))

    # -- handlers -------------------------------------------------------------------------------

    def handler(self, node: Node) -> Any:
        spec = self.spec
        if spec["settings"] == "shoal":
            return self.shoal_handler(node)
        return self.torch_handler(node)

    def shoal_handler(self, node: Node) -> Any:
        """What ``shoal run --nnodes N --rdzv-backend B`` makes on node ``index``: its plan, then
        torch's registry with shoal's backends (the launch core's ``_apply_plan``)."""
        from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry

        from shoal.env.network import Route
        from shoal.launch.options import LaunchOptions
        from shoal.launch.rendezvous.plan import plan_rendezvous

        spec, i = self.spec, node.index
        conf = dict(spec.get("conf", {}))
        where: dict[str, Any]
        if spec["backend"] == "c10d":
            conf["is_host"] = "1" if i == 0 else "0"
            where = {"rdzv_endpoint": f"{HOST}:{spec['port']}"}
        else:
            where = {"master_addr": HOST, "master_port": spec["port"]}
        options = LaunchOptions(
            nproc=1, nnodes=spec["nnodes"], node_rank=i, rdzv_backend=spec["backend"], rdzv_id=spec["run_id"],
            join_timeout=float(spec["join_timeout"]), rdzv_conf=tuple((k, str(v)) for k, v in conf.items()), **where,
        )  # fmt: skip
        # The route a node of a real cluster finds (not loopback: on loopback shoal assumes every node
        # shares this machine and skips its wait for the store's host), over 127.0.0.1.
        route = Route(HOST, HOST, HOST, "lo", "simulated node", master_is_local=i == 0, loopback=False)
        plan = plan_rendezvous(options, route, {}, now=time.monotonic())
        params = RendezvousParameters(
            backend=plan.launch_backend, endpoint=plan.endpoint, run_id=plan.run_id, min_nodes=plan.min_nodes,
            max_nodes=plan.max_nodes, local_addr=plan.local_addr, **{**TORCH_CONFIGS, **plan.rdzv_configs},
        )  # fmt: skip
        return rendezvous_handler_registry.create_handler(params)

    def torch_handler(self, node: Node) -> Any:
        """torch's own handler with torch's defaults, over a store made with torch's arguments; only
        the host's store listens on 127.0.0.1 alone (shoal's ``serve_store``), not on every interface."""
        from datetime import timedelta

        import torch.distributed as dist
        from torch.distributed.elastic.rendezvous import RendezvousParameters
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler
        from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous

        from shoal.launch.rendezvous.stores import serve_store

        spec, i = self.spec, node.index
        min_nodes, max_nodes = _node_counts(spec["nnodes"])
        if spec["backend"] == "static":
            timeout = TORCH_CONFIGS["timeout"]
            if i == 0:
                store = serve_store(HOST, spec["port"], timeout=timeout, world_size=max_nodes, wait=True)
            else:
                store = dist.TCPStore(
                    HOST, spec["port"], max_nodes, False, timedelta(seconds=timeout), multi_tenant=True
                )
            handler = StaticTCPRendezvous(HOST, spec["port"], i, max_nodes, spec["run_id"], timeout)
            handler._store = self.wrap(store)  # what its next_rendezvous would make, made here
            return handler
        read = TORCH_READ_TIMEOUT_S
        if i == 0:
            store = serve_store(HOST, spec["port"], timeout=read)
        else:
            store = dist.TCPStore(
                HOST, spec["port"], is_master=False, multi_tenant=True, timeout=timedelta(seconds=read)
            )
        store = self.wrap(store)
        conf = {**TORCH_CONFIGS, **spec.get("conf", {}), "is_host": i == 0}
        params = RendezvousParameters(
            backend="c10d", endpoint=f"{HOST}:{spec['port']}", run_id=spec["run_id"], min_nodes=min_nodes,
            max_nodes=max_nodes, local_addr=HOST, **conf,
        )  # fmt: skip
        return create_handler(store, C10dRendezvousBackend(store, spec["run_id"]), params)

    # -- the agent ------------------------------------------------------------------------------

    def agent(self, node: Node) -> Any:
        import signal

        from torch.distributed.elastic.agent.server.api import RunResult, SimpleElasticAgent, WorkerSpec, WorkerState

        sim = self

        class SimulatedAgent(SimpleElasticAgent):
            """torch's agent; its workers are none: they run until the parent says how they end."""

            def _start_workers(self, worker_group: Any) -> dict[int, Any]:
                node.started.append(time.time())
                node.world.append(worker_group.group_world_size)
                node.at_start.append(dict(node.counts))
                sim.started(node)
                return {w.local_rank: 0 for w in worker_group.workers}

            def _stop_workers(self, worker_group: Any, *args: Any, **kwargs: Any) -> None:
                pass

            def _monitor_workers(self, worker_group: Any) -> Any:
                if node.killed.is_set():
                    sim.end.wait()
                    raise _Killed
                if node.fail.is_set():
                    node.fail.clear()
                    return RunResult(state=WorkerState.FAILED)
                if sim.finish.is_set():
                    done = {w.global_rank: None for w in worker_group.workers}
                    return RunResult(state=WorkerState.SUCCEEDED, return_values=done)
                return RunResult(state=WorkerState.HEALTHY)

            def _exit_barrier(self) -> None:
                super()._exit_barrier()
                node.exit_done = time.time()

            def _shutdown(self, death_sig: Any = signal.SIGTERM, timeout: int = 30, **kwargs: Any) -> None:
                pass  # no workers; torch's launch_agent shuts the handler down afterwards (below)

        spec = WorkerSpec(
            role="default", local_world_size=1, entrypoint="simulated", rdzv_handler=node.handler,
            max_restarts=self.spec["max_restarts"], monitor_interval=self.spec["monitor_interval"],
        )  # fmt: skip
        return SimulatedAgent(spec, exit_barrier_timeout=EXIT_BARRIER_S)

    def run_node(self, node: Node) -> None:
        self.local.node = node
        try:
            node.handler = self.handler(node)
            agent = self.agent(node)
            agent.run()
            node.handler.shutdown()  # torch's launch_agent, after a run that ended normally
            node.shutdown_done = time.time()
        except _Killed:
            pass
        except BaseException as err:  # reported with the results
            import traceback

            where = traceback.extract_tb(err.__traceback__)[-3:]
            at = "; ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in where)
            node.error = f"{type(err).__name__}: {err} (after {time.time() - self.go_at:.1f} s, at {at})"
            self.started(node)

    def started(self, node: Node) -> None:
        """Say ``closed`` once every live node here has started its workers ``round`` times."""
        with self.lock:
            live = [n for n in self.nodes if not n.killed.is_set()]
            failed = [n for n in live if n.error]
            if failed:
                _say(event="error", index=failed[0].index, error=failed[0].error)
                return
            rounds = min(len(n.started) for n in live) if live else 0
            if rounds > self.reported_rounds:
                self.reported_rounds = rounds
                last = max(n.started[rounds - 1] for n in live)
                _say(event="closed", round=rounds, t=last, worlds=sorted({n.world[rounds - 1] for n in live}))

    def totals(self) -> dict[str, int]:
        total: Counter = Counter()
        for n in self.nodes:
            if not n.killed.is_set():
                total.update(n.counts)
        return dict(total)

    def kill(self, index: int) -> None:
        for n in self.nodes:
            if n.index == index:
                n.killed.set()
                inner = getattr(n.handler, "inner", n.handler)  # shoal's handler wraps torch's
                inner._stop_heartbeats()

    def serve(self) -> None:
        threads = [threading.Thread(target=self.run_node, args=(n,), daemon=True) for n in self.nodes]
        _say(event="ready", pid=os.getpid())
        for line in sys.stdin:
            word, *rest = line.split()
            if word == "go":
                self.go_at = time.time()
                for t in threads:
                    t.start()
            elif word == "mark":
                _say(event="marked", counts=self.totals(), live=sum(not n.killed.is_set() for n in self.nodes))
            elif word == "kill":
                self.kill(int(rest[0]))
            elif word == "fail":
                for n in self.nodes:
                    if not n.killed.is_set():
                        n.fail.set()
            elif word == "finish":
                self.finish.set()
                for t, n in zip(threads, self.nodes):
                    if not n.killed.is_set():
                        t.join(timeout=max(1.0, self.spec["deadline"] - time.time()))
                self.end.set()
                _say(event="done", nodes=[n.record() for n in self.nodes])
                return


class _Killed(Exception):
    """A killed node's agent thread ends here, without leaving the rendezvous."""


def _node_counts(nnodes: str) -> tuple[int, int]:
    low, _, high = nnodes.partition(":")
    return int(low), int(high or low)


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # shoal's launcher sets it; see rendezvous_scale
    sim = Simulation(spec)
    if spec["settings"] == "shoal":
        from shoal.launch.rendezvous.handlers import register_backends

        register_backends()
        sim.patch_shoal()
    import torch.distributed.elastic.agent.server.api  # noqa: F401  (imported before "ready")

    sim.serve()
    sys.stdout.flush()
    # Nothing of a simulated job outlives it: not a node blocked in the store, nor the store's threads.
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
