"""Start the replica groups of a fault-tolerant job on this node, and restart those that fail.

``shoal train --fault-tolerance --nproc N`` runs N replica groups of one process each beside a
supervised torchft lighthouse (:mod:`shoal.train.ft.lighthouse`); with ``--nproc-per-group K``, N / K
groups of K processes each (a process group of their own: DDP or FSDP inside, HSDP). Unlike an elastic restart, a
failed group is restarted *alone*: the other groups go on training (they lose one step), and the
restarted one heals from a live peer. Each group has its own store (torchft's Manager needs one per
group): a group of one process serves it itself; a group of several meets as torchrun's workers do,
its rank 0 hosting the store on a port chosen here for each start.

Each process of a group runs ``entrypoint(*args)``, forked (spawned with CUDA, which does not
survive a fork), with its coordinates set (:mod:`shoal.env.replica`; and torchrun's RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT in a group of several) and, with CUDA, its share of the node's
GPUs as its ``CUDA_VISIBLE_DEVICES`` (its rank r computes on ``cuda:r``); what the group's rank 0
returns comes back to the launcher through a pickle file. A group fails as a whole: when one of its
processes fails, the others are stopped and all restarted.
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
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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
    before_first_quorum,
    heartbeat_note,
    set_first_quorum_gate,
)
from shoal.errors import ShoalError
from shoal.launch.failures import says_peer_gone
from shoal.launch.ports import find_free_port
from shoal.launch.process import die_with_parent, reset_inherited_signal_handlers, signal_name
from shoal.launch.rendezvous.plan import SOCKET_IFNAME_VARS
from shoal.launch.rendezvous.stores import serve_store
from shoal.stopping import stop_with_grace
from shoal.train.ft.events import NODE_ENV
from shoal.train.ft.lighthouse import QUORUM_RETRIES, Lighthouse
from shoal.train.ft.watch import GroupWatch

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
_FAILED_BEFORE_TRAINING = 3
"""A worker's exit status for an exception raised before its group's first quorum, on the job's
first start: in the code or its input (a wrong argument, a broken model), which every start would
hit again; never restarted."""


@dataclass
class _Group:
    index: int
    processes: list[Any] = field(default_factory=list)
    """The group's processes, its rank 0 first."""
    starts: int = 0
    started_at: float = 0.0

    @property
    def pid(self) -> int:
        """Rank 0's: the process that speaks for the group (its events, its progress record)."""
        return self.processes[0].pid

    def ended(self) -> tuple[int, int] | None:
        """None while the group runs; ``(0, 0)`` once every process exited 0; else the failed
        rank's ``(status, rank)``: a bad-input exit first (it stops the job whichever rank said it),
        then one killed by a signal (the others of the group fail after it, in their collectives),
        then any other failure, and a failure before training last."""
        codes = [p.exitcode for p in self.processes]
        # A rank that failed before it trained stops the job only if no rank of its group was
        # killed or failed otherwise: its peers' failures then follow from that (a peer gone).
        failed = sorted(
            ((c != _BAD_INPUT, c == _FAILED_BEFORE_TRAINING, c > 0, rank), c)
            for rank, c in enumerate(codes)
            if c not in (None, 0)
        )
        if failed:
            (*_, rank), code = failed[0]
            return code, rank
        return (0, 0) if all(c == 0 for c in codes) else None


def run_replica_groups(
    entrypoint: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    groups: int,
    group_nproc: int = 1,
    max_restarts: int = DEFAULT_MAX_RESTARTS,
    lighthouse: str | None = None,
    host: str = "127.0.0.1",
    first: int = 0,
    total: int | None = None,
    lighthouse_port: int | None = None,
    hang_timeout: float | None = None,
    run_dir: str | os.PathLike | None = None,
    start_method: str = "fork",
    gpus: Sequence[str] = (),
) -> dict[int, Any]:
    """Run ``groups`` replica groups of ``entrypoint(*args)`` here; return what each group returned.

    ``group_nproc``: processes per group (a group of several is a process group of its own, its
    processes started, watched and restarted together). Across nodes, this node's groups are ``first`` .. ``first + groups - 1`` of the job's ``total``
    (default: ``groups``, one node). ``host``: the address every socket of this node's groups binds.
    ``lighthouse``: the URL of a lighthouse someone else runs (another node, or the user's); default,
    one started here on ``host`` (port ``lighthouse_port``, default a free one). ``max_restarts``:
    restarts per group before the job fails. ``hang_timeout``: seconds without progress before a
    group is reported hung (:mod:`shoal.train.ft.watch`; default the watchdog's rule).
    ``run_dir``: where the groups write their records and events (``shoal train``'s ``--out``), which
    the watch reads; None for a user's own loop. ``start_method``: ``fork`` or ``spawn`` (then
    ``entrypoint`` and ``args`` must pickle). ``gpus``: with CUDA, the node's GPUs (as
    ``CUDA_VISIBLE_DEVICES`` names them), handed out in order, ``group_nproc`` to a group (groups of
    one process take turns when there are fewer than groups). Raises ShoalError when a group fails
    for bad input (every group would) or runs out of restarts; the others are stopped.
    """
    total = groups if total is None else total
    if total < 2:
        raise ShoalError(
            f"--fault-tolerance needs at least 2 replica groups, got {total}",
            "pass --nproc 2 or more (one replica group per process), or run on several nodes",
        )
    note = heartbeat_note(total)
    if note is not None and first == 0:  # node 0's launcher says it once
        write_line(note)
    run_path = Path(run_dir) if run_dir is not None else None
    layout = _Layout(groups, first, total, hang_timeout, run_path, group_nproc, tuple(gpus))
    context = multiprocessing.get_context(start_method)
    with tempfile.TemporaryDirectory(prefix="shoal-groups-") as results_dir:
        results = Path(results_dir)
        if lighthouse is not None:
            return _supervise(context, entrypoint, args, layout, max_restarts, lighthouse, host, results)
        with Lighthouse(host, lighthouse_port, groups=total) as served:
            return _supervise(context, entrypoint, args, layout, max_restarts, served.url, host, results)


@dataclass(frozen=True)
class _Layout:
    """This node's share of the job's replica groups."""

    count: int
    first: int
    total: int
    hang_timeout: float | None = None
    run_dir: Path | None = None
    group_nproc: int = 1
    gpus: tuple[str, ...] = ()

    @property
    def node(self) -> int:
        """This node's rank: its groups are ``node x count`` onwards."""
        return self.first // self.count

    def gpus_of(self, group: int) -> str | None:
        """Group ``group``'s ``CUDA_VISIBLE_DEVICES``: the next ``group_nproc`` of the node's GPUs,
        or with fewer GPUs than processes (groups of one), one in turn; None on the CPU."""
        if not self.gpus:
            return None
        local, size = group - self.first, self.group_nproc
        if len(self.gpus) >= self.count * size:
            return ",".join(self.gpus[local * size : (local + 1) * size])
        return self.gpus[local % len(self.gpus)]


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
    # Each group's processes are a world of their own: without this each would take every core for
    # itself, and the groups would oversubscribe the node (14x slower steps measured with 2 groups
    # of one process on 2 cores).
    if not os.environ.get("OMP_NUM_THREADS"):
        base["OMP_NUM_THREADS"] = str(threads_per_process(count * layout.group_nproc))
    # The replicas' gloo group listens on the interface of ``host`` (gloo's default: the address
    # the hostname resolves to); a user's own choice wins.
    for name in SOCKET_IFNAME_VARS:
        ifname = os.environ.get(name) or interface_of(host)
        if ifname:
            base[name] = ifname
    # Started again by an outer supervisor (a Slurm batch script's step per group), a launcher
    # numbers its groups' starts from the count it was given.
    before = int(os.environ.get(STARTS_ENV, "1")) - 1
    groups = [_Group(layout.first + i, starts=before) for i in range(count)]
    watch = GroupWatch(layout.run_dir, layout.node, host, layout.hang_timeout)
    # The first start of every group meets here before its first quorum (a late group would
    # otherwise miss it and heal at step 1); a restarted group does not wait.
    gate = context.Barrier(count * layout.group_nproc, timeout=_GATE_TIMEOUT_S)
    start = functools.partial(
        _start, context, entrypoint=entrypoint, args=args, base=base, results=results, gpus_of=layout.gpus_of
    )
    try:
        for group in groups:
            start(group, layout.group_nproc, host, gate)
        running = list(groups)
        while running:
            time.sleep(_POLL_S)
            watch.poll({g.index: g.pid for g in running if g.processes[0].exitcode is None})
            for group in list(running):
                ended = group.ended()
                if ended is None:
                    continue
                _stop_group(group)  # a group of several fails as a whole: its other ranks go too
                code, rank = ended
                if code == 0:
                    running.remove(group)
                    continue
                _refuse_to_restart(group, code, max_restarts)
                pid, lived = group.processes[rank].pid, time.monotonic() - group.started_at
                which = f"rank {rank} of {len(group.processes)}, " if len(group.processes) > 1 else ""
                write_line(
                    f"shoal: replica group {group.index} ({which}pid {pid}) {_how(code)} "
                    f"{watch.died(group.index, pid, _how(code), lived)}; restarting it "
                    f"({group.starts}/{max_restarts}), the other groups train on"
                )
                start(group, layout.group_nproc, host, None)
    finally:
        _stop_all(groups)
    out: dict[int, Any] = {}
    for group in groups:
        path = results / f"group-{group.index}.pkl"
        if path.exists():
            out[group.index] = pickle.loads(path.read_bytes())
    return out


def _start(
    context: Any, group: _Group, nproc: int, host: str, gate: Any, *,
    entrypoint: Callable[..., Any], args: tuple, base: dict, results: Path, gpus_of: Callable[[int], str | None],
) -> None:  # fmt: skip
    """Start (again) every process of ``group``: rank 0 writes the group's result."""
    group.starts += 1
    env = {**base, GROUP_ENV: str(group.index), STARTS_ENV: str(group.starts)}
    gpus = gpus_of(group.index)
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    if nproc > 1:  # torchrun's variables: the group's ranks meet at its rank 0's store, a new port each start
        port = str(find_free_port(host))
        env.update(WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR=host, MASTER_PORT=port)
        # Rank 0 serves the store on the group's address only (``_group_main``); every rank joins it
        # as torchrun's workers join their agent's (torch.distributed.rendezvous._create_c10d_store).
        env.update({"SHOAL_ENV": "torchrun", STORE_ENV: f"{host}:{port}", "TORCHELASTIC_USE_AGENT_STORE": "True"})
    group.processes = []
    for rank in range(nproc):
        ranked = {**env, "RANK": str(rank), "LOCAL_RANK": str(rank)} if nproc > 1 else env
        target = results / f"group-{group.index}.pkl" if rank == 0 else None
        process = context.Process(target=_group_main, args=(entrypoint, args, ranked, target, gate), daemon=False)
        process.start()
        group.processes.append(process)
    group.started_at = time.monotonic()


def _group_main(
    entrypoint: Callable[..., Any], args: tuple, env: dict[str, str], target: Path | None, gate: Any
) -> None:
    die_with_parent()
    reset_inherited_signal_handlers()
    # A group is a world of one process, also when this launcher is itself a rank of an outer job
    # (shoal launch --hosts, torchrun): the outer job's coordinates are not the group's.
    for name in [n for n in os.environ if n in _OUTER_JOB_VARS or n.startswith("TORCHELASTIC_")]:
        del os.environ[name]
    os.environ.update(env)
    if gate is not None:
        set_first_quorum_gate(functools.partial(_wait_at, gate))
    # The group's own store (torchft's Manager finds its server's address there; a group of
    # several meets there), on the group's address only, served by its rank 0 as long as it lives.
    store = None
    if STORE_ENV not in env:  # a group of one process: any free port
        store = serve_store(env[ADDRESS_ENV], 0, timeout=_STORE_TIMEOUT_S)
        os.environ[STORE_ENV] = f"{env[ADDRESS_ENV]}:{store.port}"
    elif env["RANK"] == "0":
        store = serve_store(env[ADDRESS_ENV], int(env["MASTER_PORT"]), timeout=_STORE_TIMEOUT_S)
    try:
        result = entrypoint(*args)
    except ShoalError as err:  # one line, and its status: bad input (2) stops the job, 1 restarts the group
        write_line(err.format())
        raise SystemExit(err.exit_code) from None
    except Exception as err:
        if not before_first_quorum() or env[STARTS_ENV] != "1" or says_peer_gone(str(err)):
            raise  # a group that trained, came back, or lost a peer: restarted
        # Failed before it trained, at the job's first start: every restart would fail the same way
        # (each group 10 times, a traceback each). Its traceback once, and the job stops.
        traceback.print_exc()
        raise SystemExit(_FAILED_BEFORE_TRAINING) from None
    del store
    if target is None:
        return
    tmp = target.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(result))
    tmp.replace(target)


def _wait_at(gate: Any) -> None:
    """Wait for the other groups' first start; a group that died before it breaks the gate, and
    the others go on (they heal it later)."""
    with contextlib.suppress(threading.BrokenBarrierError):
        gate.wait()


def _refuse_to_restart(group: _Group, code: int, max_restarts: int) -> None:
    if code == _FAILED_BEFORE_TRAINING:  # its traceback is above
        raise ShoalError(
            f"replica group {group.index} failed before it trained, at its first start: every restart would fail the same way",
            "fix the error in its traceback above, then run the same command again",
        )
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


def _stop_group(group: _Group) -> None:
    """The group's processes still running (a group of several whose one rank failed: the others
    are blocked in a collective with it) are SIGKILLed, and all reaped."""
    for process in group.processes:
        if process.exitcode is None:
            process.kill()
        process.join()


def _stop_all(groups: list[_Group]) -> None:
    """SIGTERM the groups still running, then SIGKILL those that do not go within 5 s."""
    started = [p for g in groups for p in g.processes]
    # Process.terminate/kill send SIGTERM/SIGKILL and ignore a process already gone.
    stop_with_grace(
        started, running=lambda p: p.is_alive(), ask=lambda p: p.terminate(), kill=lambda p: p.kill(), grace_s=5.0
    )
    for process in started:
        process.join()  # reap
