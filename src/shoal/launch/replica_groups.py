"""Start the replica groups of a fault-tolerant job on this node, and restart those that fail.

``shoal train --fault-tolerance --nproc N`` runs N replica groups of one process each beside a
supervised torchft lighthouse (:mod:`shoal.launch.lighthouse`). Unlike an elastic restart, a
failed group is restarted *alone*: the other groups go on training (they lose one step), and the
restarted one heals from a live peer. Each group's process serves its own store (torchft's
Manager needs one per group).

Each group runs ``entrypoint(*args)`` in a forked process with its coordinates set
(:mod:`shoal.env.replica`); what it returns comes back to the launcher through a pickle file.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import pickle
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.console import write_line
from shoal.env.host import threads_per_process
from shoal.env.network import interface_of
from shoal.env.replica import (
    ADDRESS_ENV,
    GROUP_ENV,
    GROUPS_ENV,
    LIGHTHOUSE_ENV,
    STARTS_ENV,
    STORE_ENV,
    set_first_quorum_gate,
)
from shoal.errors import ShoalError
from shoal.launch.lighthouse import QUORUM_RETRIES, Lighthouse
from shoal.launch.process import die_with_parent, reset_inherited_signal_handlers, signal_name
from shoal.launch.rendezvous.plan import SOCKET_IFNAME_VARS
from shoal.launch.rendezvous.stores import serve_store
from shoal.launch.replica_watch import GroupWatch
from shoal.replica_log import NODE_ENV
from shoal.stopping import stop_with_grace

DEFAULT_MAX_RESTARTS = 10
_POLL_S = 0.05
_STORE_TIMEOUT_S = 60.0
_GATE_TIMEOUT_S = 120.0
_OUTER_JOB_VARS = frozenset(
    ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK")
    + ("ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT")
)
"""torchrun's worker variables (torch.distributed.elastic.agent.server.local_elastic_agent)."""
_BAD_INPUT = 2
"""A worker's exit status for a ShoalError (bad input): the same in every group, never restarted."""


@dataclass
class _Group:
    index: int
    process: Any = None
    starts: int = 0
    started_at: float = 0.0


def run_replica_groups(
    entrypoint: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    groups: int,
    max_restarts: int = DEFAULT_MAX_RESTARTS,
    lighthouse: str | None = None,
    host: str = "127.0.0.1",
    first: int = 0,
    total: int | None = None,
    lighthouse_port: int | None = None,
    hang_timeout: float | None = None,
    run_dir: str | os.PathLike | None = None,
) -> dict[int, Any]:
    """Run ``groups`` replica groups of ``entrypoint(*args)`` here; return what each group returned.

    Across nodes, this node's groups are ``first`` .. ``first + groups - 1`` of the job's ``total``
    (default: ``groups``, one node). ``host``: the address every socket of this node's groups binds.
    ``lighthouse``: the URL of a lighthouse someone else runs (another node, or the user's); default,
    one started here on ``host`` (port ``lighthouse_port``, default a free one). ``max_restarts``:
    restarts per group before the job fails. ``hang_timeout``: seconds without progress before a
    group is reported hung (:mod:`shoal.launch.replica_watch`; default the watchdog's rule).
    ``run_dir``: where the groups write their records and events (``shoal train``'s ``--out``), which
    the watch reads; None for a user's own loop. Raises ShoalError when a group fails for bad input
    (every group would) or runs out of restarts; the others are stopped.
    """
    total = groups if total is None else total
    if total < 2:
        raise ShoalError(
            f"--fault-tolerance needs at least 2 replica groups, got {total}",
            "pass --nproc 2 or more (one replica group per process), or run on several nodes",
        )
    layout = _Layout(groups, first, total, hang_timeout, Path(run_dir) if run_dir is not None else None)
    context = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="shoal-groups-") as results_dir:
        results = Path(results_dir)
        if lighthouse is not None:
            return _supervise(context, entrypoint, args, layout, max_restarts, lighthouse, host, results)
        with Lighthouse(host, lighthouse_port) as served:
            return _supervise(context, entrypoint, args, layout, max_restarts, served.url, host, results)


@dataclass(frozen=True)
class _Layout:
    """This node's share of the job's replica groups."""

    count: int
    first: int
    total: int
    hang_timeout: float | None = None
    run_dir: Path | None = None

    @property
    def node(self) -> int:
        """This node's rank: its groups are ``node x count`` onwards."""
        return self.first // self.count


def _supervise(
    context: Any,
    entrypoint: Callable[..., Any],
    args: tuple[Any, ...],
    layout: _Layout,
    max_restarts: int,
    lighthouse: str,
    host: str,
    results: Path,
) -> dict[int, Any]:
    count = layout.count
    base = {
        GROUPS_ENV: str(layout.total),
        "SHOAL_ENV": "local",  # whatever launched this launcher (mpirun, srun), a group is one process
        ADDRESS_ENV: host,
        NODE_ENV: str(layout.node),
        LIGHTHOUSE_ENV: lighthouse,
        "TORCHFT_QUORUM_RETRIES": str(QUORUM_RETRIES),
        "RUST_LOG": os.environ.get("RUST_LOG", "warn"),
    }
    # Each group is a world of one process: without this it would take every core for itself, and
    # N groups would oversubscribe the node (14x slower steps measured with 2 groups on 2 cores).
    if not os.environ.get("OMP_NUM_THREADS"):
        base["OMP_NUM_THREADS"] = str(threads_per_process(count))
    # The replicas' gloo group listens on the interface of ``host`` (gloo's default: the address
    # the hostname resolves to); a user's own choice wins.
    for name in SOCKET_IFNAME_VARS:
        ifname = os.environ.get(name) or interface_of(host)
        if ifname:
            base[name] = ifname
    groups = [_Group(layout.first + i) for i in range(count)]
    watch = GroupWatch(layout.run_dir, layout.node, host, layout.hang_timeout)
    # The first start of every group meets here before its first quorum (a late group would
    # otherwise miss it and heal at step 1); a restarted group does not wait.
    gate = context.Barrier(count, timeout=_GATE_TIMEOUT_S)
    try:
        for group in groups:
            _start(context, group, entrypoint, args, base, results, gate)
        running = list(groups)
        while running:
            time.sleep(_POLL_S)
            watch.poll({g.index: g.process.pid for g in running if g.process.exitcode is None})
            for group in list(running):
                code = group.process.exitcode
                if code is None:
                    continue
                group.process.join()
                if code == 0:
                    running.remove(group)
                    continue
                _refuse_to_restart(group, code, max_restarts)
                pid, lived = group.process.pid, time.monotonic() - group.started_at
                write_line(
                    f"shoal: replica group {group.index} (pid {pid}) {_how(code)} "
                    f"{watch.died(group.index, pid, _how(code), lived)}; restarting it "
                    f"({group.starts}/{max_restarts}), the other groups train on"
                )
                _start(context, group, entrypoint, args, base, results, None)
    finally:
        _stop_all(groups)
    out: dict[int, Any] = {}
    for group in groups:
        path = results / f"group-{group.index}.pkl"
        if path.exists():
            out[group.index] = pickle.loads(path.read_bytes())
    return out


def _start(
    context: Any, group: _Group, entrypoint: Callable[..., Any], args: tuple, base: dict, results: Path, gate: Any
) -> None:
    group.starts += 1
    env = {**base, GROUP_ENV: str(group.index), STARTS_ENV: str(group.starts)}
    target = results / f"group-{group.index}.pkl"
    group.process = context.Process(target=_group_main, args=(entrypoint, args, env, target, gate), daemon=False)
    group.process.start()
    group.started_at = time.monotonic()


def _group_main(entrypoint: Callable[..., Any], args: tuple, env: dict[str, str], target: Path, gate: Any) -> None:
    die_with_parent()
    reset_inherited_signal_handlers()
    # A group is a world of one process, also when this launcher is itself a rank of an outer job
    # (shoal launch --hosts, torchrun): the outer job's coordinates are not the group's.
    for name in [n for n in os.environ if n in _OUTER_JOB_VARS or n.startswith("TORCHELASTIC_")]:
        del os.environ[name]
    os.environ.update(env)
    if gate is not None:
        set_first_quorum_gate(functools.partial(_wait_at, gate))
    # The group's own store (torchft's Manager finds its server's address there), on the group's
    # address only, alive as long as the group.
    store = serve_store(env[ADDRESS_ENV], 0, timeout=_STORE_TIMEOUT_S)
    os.environ[STORE_ENV] = f"{env[ADDRESS_ENV]}:{store.port}"
    result = entrypoint(*args)
    del store
    tmp = target.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(result))
    tmp.replace(target)


def _wait_at(gate: Any) -> None:
    """Wait for the other groups' first start; a group that died before it breaks the gate, and
    the others go on (they heal it later)."""
    with contextlib.suppress(threading.BrokenBarrierError):
        gate.wait()


def _refuse_to_restart(group: _Group, code: int, max_restarts: int) -> None:
    if code == _BAD_INPUT:  # the group said why (one line + HINT); every group would say the same
        err = ShoalError(f"replica group {group.index} stopped on bad input", "fix it and run again")
        err.quiet = True
        raise err
    if group.starts > max_restarts:
        raise ShoalError(
            f"replica group {group.index} {_how(code)} and has no restart left ({max_restarts} used)",
            "read its traceback above; raise --max-restarts if its failures are transient",
        )


def _how(code: int) -> str:
    return f"was killed by {signal_name(-code)}" if code < 0 else f"exited with status {code}"


def _stop_all(groups: list[_Group]) -> None:
    """SIGTERM the groups still running, then SIGKILL those that do not go within 5 s."""
    started = [g.process for g in groups if g.process is not None]
    # Process.terminate/kill send SIGTERM/SIGKILL and ignore a process already gone.
    stop_with_grace(
        started, running=lambda p: p.is_alive(), ask=lambda p: p.terminate(), kill=lambda p: p.kill(), grace_s=5.0
    )
    for process in started:
        process.join()  # reap
