"""The launch core: start this node's workers through torch's elastic agent, and say what happened.

``shoal run`` (a script or program per worker) and :func:`shoal.launch.local.launch_local` (a Python
function per worker: ``shoal train --nproc``, ``shoal demo``, ``shoal.fit``) both end here, in
:func:`run_workers`. It owns, once for every launcher:

- the rendezvous: the plan (:mod:`shoal.launch.rendezvous`) applied to torch's ``LaunchConfig``,
  shoal's handlers registered, the store's port checked before anything starts;
- the workers' environment: ``OMP_NUM_THREADS`` (usable cores / workers unless set), the plan's
  interface variables, restored afterwards so a library call leaves its caller's environment alone;
- the workers' life: each dies with the launcher (:func:`shoal.launch.process.die_with_parent`),
  a forked one starts with default signal handlers, a program's stderr is tee'd into a per-rank log;
- what the user sees: shoal's own start, restart and failure lines (torch's agent logs only with
  ``verbose``), the failing rank's own traceback, one line when a signal stopped the job;
- the watch over the workers (:class:`shoal.launch.watchdog.JobWatch`): ``RUN_DIR/progress`` named
  in ``SHOAL_PROGRESS_DIR`` and cleared at each attempt, the monitor beside torch's agent (hangs,
  stragglers, ``--on-hang``), the progress shared with the other nodes through the rendezvous store,
  and no worker left running when the launcher returns.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from shoal.console import LAUNCHER_ENV, write_line
from shoal.env.host import threads_per_process, usable_cores
from shoal.launch.failures import (
    PREEMPTED_CODES,
    SLURM_WARNING_HINT,
    WorkersFailed,
    first_recorded_failure,
    hang_failure,
    launcher_stopped,
    rendezvous_failure,
    workers_failed,
)
from shoal.launch.oom import memory_state
from shoal.launch.options import oversubscribed
from shoal.launch.ports import check_port_free
from shoal.launch.process import die_with_parent, reset_inherited_signal_handlers
from shoal.launch.rendezvous.handlers import (
    MEMBERSHIP,
    ROUNDS,
    SHARED_STORE_OPT_OUT,
    STOPPING,
    StopRequested,
    register_backends,
)
from shoal.launch.rendezvous.plan import RendezvousPlan
from shoal.launch.watchdog import JobWatch
from shoal.launch.worker_logs import recording_logs_specs, wait_for_tees
from shoal.progress import ENV_DIR

# The launch's failures are said in shoal.launch.failures; its callers meet them here too.
__all__ = ["PREEMPTED_CODES", "SLURM_WARNING_HINT", "Launch", "WorkersFailed", "function_worker", "run_workers"]

WORKER_SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_shim.py")
_TORCH_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing")
"""Loggers of torch's agent and of the start contexts it uses ("Terminating process N via signal
SIGTERM" for every worker it stops after a failure comes from torch.multiprocessing.spawn)."""


@dataclass
class Launch:
    """What :func:`run_workers` needs besides torch's ``LaunchConfig`` and the entrypoint."""

    plan: RendezvousPlan
    prog: str = "shoal"
    """How lines start (``shoal run``, ``shoal``)."""
    command: str = ""
    """The command the user ran (``shoal train``), named to the workers (``SHOAL_LAUNCHER``); default ``prog``."""
    announce_single_node: bool = False
    """Print a start line on a single node too (``shoal run``; ``shoal train`` has its own)."""
    log_dir: str = ""
    """The workers' log directory, the one ``config.logs_specs`` writes to."""
    keep_logs: bool = False
    """The user chose the log directory: keep it, and name it in failure reports (else it is removed)."""
    verbose: bool = False
    """Show torch's elastic agent logs."""
    stopped_note: str = "workers stopped"
    """What a signal to the launcher did, for its one line."""
    starts: list[int] = field(default_factory=list)
    """Restart count of every start so far (filled in as the workers start)."""
    changes_seen: int = 0
    """Membership changes of the rendezvous already announced."""
    threads_note: str = ""
    """The start lines' ``, OMP_NUM_THREADS=N (who set it)``, taken from the environment the launch
    began in (the workers' environment holds shoal's own value by the time they start)."""
    run_dir: str = ""
    """Where ``progress/`` and the hang reports (``hang-<time>/``) go; default ``log_dir`` (then kept
    after a hang report, removed otherwise)."""
    hang_timeout: float | None = None
    """``--hang-timeout``: None derives it from the step time (docs/WATCHDOG.md)."""
    on_hang: str = "report"
    """``--on-hang``: report, stop or restart."""
    watch: JobWatch | None = None
    """The watch over this launch's workers, while it runs."""


def run_workers(
    config: Any, entrypoint: Callable[..., Any] | str, args: tuple[Any, ...], launch: Launch
) -> dict[int, Any]:
    """Start ``config.nproc_per_node`` workers running ``entrypoint(*args)`` (a function) or the
    program ``entrypoint ARGS`` and wait for them; return ``{local rank: return value}``.

    Raises:
        WorkersFailed: a worker failed (the failing rank's traceback and a summary line), or the
            workers or the launcher were stopped by a signal (exit status 128 + signal).
        ShoalError: the rendezvous could not complete (endpoint, arrivals, hint), or its port is taken.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    plan = launch.plan
    launch.threads_note = _threads_note(config, os.environ, plan.nodes_here)
    too_many = oversubscribed(config.nproc_per_node, usable_cores())
    if too_many:
        write_line(f"{launch.prog}: warning: {too_many[0]}\nHINT: {too_many[1]}")
    memory_before = memory_state()  # to tell an OOM kill of these workers from earlier ones
    _apply_plan(config, plan)
    _check_ports(plan)
    register_backends()
    entrypoint, args, shimmed = _worker_command(entrypoint, args)
    if not plan.single_node:
        for line in plan.lines(launch.prog, config.nproc_per_node, extra=launch.threads_note):
            write_line(line)
    recorder = recording_logs_specs(
        config.logs_specs, tee=shimmed, on_start=lambda env, failed: _on_start(launch, config, env, failed)
    )
    config.logs_specs = recorder
    _before_fork()
    watch = launch.watch = _watch(config, launch)
    try:
        with (
            _workers_environ(
                config,
                plan,
                launch.verbose,
                watch.progress_dir if watch.enabled else None,
                launch.command or launch.prog,
            ),
            _torch_logs(launch.verbose, launch.log_dir if launch.keep_logs else None),
        ):
            watch.start()
            return elastic_launch(config, entrypoint)(*args)
    except ChildFailedError as err:
        wait_for_tees(recorder.stderrs.values())
        watch.settle()
        if watch.stopped_this_attempt:  # not a later attempt's own failure
            raise hang_failure(launch.prog, watch, config.max_restarts) from None
        stderrs, keep = recorder.stderrs, launch.keep_logs
        raise workers_failed(
            err, launch.prog, launch.log_dir, stderr_logs=stderrs, keep_logs=keep, memory_before=memory_before
        ) from None
    except SignalException as err:
        raise launcher_stopped(launch.prog, int(err.sigval), launch.stopped_note) from None
    except StopRequested:  # --on-hang stop, with restarts left: the agent's next rendezvous refused
        raise hang_failure(launch.prog, watch, config.max_restarts) from None
    except Exception as err:
        watch.settle()
        if watch.stopping:  # the other nodes went on failing after this one stopped its workers
            raise hang_failure(launch.prog, watch, config.max_restarts) from None
        failure = rendezvous_failure(err, plan)
        if failure is None:
            raise
        raise failure from None
    finally:
        _after_workers(config, launch, watch)


def _check_ports(plan: RendezvousPlan) -> None:
    """The port this node serves a store on is free, or a ShoalError (and its hint) says so before
    anything starts."""
    if plan.single_node and plan.workers_port:
        check_port_free(plan.workers_port, host=plan.bind_addr)  # the hint: pick another, or omit it
    elif plan.hosts_store and plan.port:
        where = "--master-port" if plan.backend == "static" else "the port in --rdzv-endpoint"
        hint = f"pick another {where} that is free on this node, and give every node the same one"
        check_port_free(plan.port, host=plan.bind_addr, hint=hint)


def _worker_command(
    entrypoint: Callable[..., Any] | str, args: tuple[Any, ...]
) -> tuple[Callable[..., Any] | str, tuple[Any, ...], bool]:
    """What torch's agent starts, and whether a program's stderr is tee'd into its log: a program
    under :mod:`~shoal.launch.worker_shim` (on Linux), a function under :func:`function_worker`."""
    if isinstance(entrypoint, str) and sys.platform.startswith("linux"):
        return sys.executable, (WORKER_SHIM, str(os.getpid()), entrypoint, *args), True
    if not isinstance(entrypoint, str):
        return function_worker, (entrypoint, *args), False
    return entrypoint, args, False


def _before_fork() -> None:
    """Forked workers start with a copy of this process's unwritten output buffers: empty them
    first, so nothing printed before the launch comes out once per worker.

    ... and with a copy of its unreachable objects. A TCPStore server of an earlier launch that
    waits in a reference cycle would be finalised by a worker's garbage collector, whose C++
    destructor then waits for a libuv thread that exists only here: a hang, or a SIGSEGV.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    gc.collect()


def _after_workers(config: Any, launch: Launch, watch: JobWatch) -> None:
    """torch's agent stopped the workers (SIGTERM, SIGKILL after its shutdown timeout); a rank it
    lost track of, or one still dying, goes now: nothing outlives the launcher. The run's
    rendezvous state goes, and the log directory unless it is kept."""
    watch.close()
    STOPPING.discard(config.run_id)
    ROUNDS.pop(config.run_id, None)
    if watch.monitor.events and str(watch.run_dir) == launch.log_dir:
        launch.keep_logs = True  # the hang reports' stacks live there: say where, keep them
    gc.collect()  # this launch's stores: their threads stop and their ports close now
    if not launch.keep_logs and launch.log_dir:
        shutil.rmtree(launch.log_dir, ignore_errors=True)
    sys.stdout.flush()


def _watch(config: Any, launch: Launch) -> JobWatch:
    """This launch's watch: progress under the run directory (default the log directory), shared
    with the other nodes through the round's rendezvous store."""
    run_id = config.run_id

    def publish(data: bytes) -> None:
        round_ = ROUNDS.get(run_id)
        if round_ is not None and round_.nodes > 1:
            round_.store.set(f"shoal/progress/{round_.node_rank}", data)

    def peers() -> list[bytes]:
        round_ = ROUNDS.get(run_id)
        if round_ is None or round_.nodes <= 1:
            return []
        keys = [f"shoal/progress/{rank}" for rank in range(round_.nodes) if rank != round_.node_rank]
        return [round_.store.get(key) for key in keys if round_.store.check([key])]

    return JobWatch(
        launch.run_dir or launch.log_dir or ".", hang_timeout=launch.hang_timeout, on_hang=launch.on_hang,
        on_stop=lambda: STOPPING.add(run_id), publish=publish, peers=peers,
    )  # fmt: skip


def function_worker(function: Callable[..., Any], *args: Any) -> Any:
    """What every worker of a function launch runs: die with the launcher, then ``function(*args)``.

    A forked worker first drops the launcher's signal handlers (see
    :func:`~shoal.launch.process.reset_inherited_signal_handlers`). Module-level, so spawned
    workers can unpickle it.
    """
    die_with_parent()
    reset_inherited_signal_handlers()
    return function(*args)


def _apply_plan(config: Any, plan: RendezvousPlan) -> None:
    config.rdzv_backend = plan.launch_backend
    config.rdzv_endpoint = plan.endpoint
    config.run_id = plan.run_id
    config.min_nodes, config.max_nodes = plan.min_nodes, plan.max_nodes
    config.rdzv_configs.update(plan.rdzv_configs)
    if not config.local_addr:
        config.local_addr = plan.local_addr


@contextlib.contextmanager
def _workers_environ(
    config: Any, plan: RendezvousPlan, verbose: bool, progress_dir: Any = None, launcher: str = "shoal"
) -> Iterator[None]:
    """Set what the workers inherit (the agent copies os.environ into them); restore afterwards.

    ``SHOAL_LAUNCHER``: ``launcher``, the command the user ran. ``SHOAL_PROGRESS_DIR``: this launch's progress directory (always this launcher's, even when the
    launcher itself runs in a job that had one); ``SHOAL_NODE_NAME``, across nodes unless set: this
    node's address (the machines' host names may all be alike, as in namespaces or pods).

    torch's launcher writes os.environ too (TORCHELASTIC_SIGNALS_TO_HANDLE): the whole mapping is
    restored, so a library call that launches workers leaves its caller's environment as it was.
    """
    saved = dict(os.environ)
    # Every node's workers count where every node runs on this machine (a loopback master).
    extra = {"OMP_NUM_THREADS": str(threads_per_process(config.nproc_per_node * plan.nodes_here)), **plan.environ}
    if not verbose:  # c10d/gloo's C++ warnings (a client's host name not resolving...): --verbose
        extra["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    else:  # each worker's own traceback on the console too (exit_hook/sitecustomize.py)
        extra["SHOAL_WORKER_TRACEBACKS"] = "1"
    if not plan.single_node and config.local_addr:
        extra["SHOAL_NODE_NAME"] = config.local_addr
    os.environ.update({k: v for k, v in extra.items() if k not in os.environ})
    os.environ[LAUNCHER_ENV] = launcher
    if progress_dir is not None:
        os.environ[ENV_DIR] = str(progress_dir)
    else:  # the watchdog is off: nothing inherited from an outer job either
        os.environ.pop(ENV_DIR, None)
    os.environ[SHARED_STORE_OPT_OUT] = "1"  # shoal serves the workers' store (see handlers)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _torch_logs(verbose: bool, log_dir: str | None) -> Iterator[None]:
    """torch's agent logs (warnings on every signal and restart) only with ``verbose``; into
    ``<log_dir>/agent.log`` when the user keeps the logs.

    torch sets each of its module loggers' own level, so they are silenced where they meet: the
    parent loggers get a handler (the file, or a NullHandler: without any handler Python's
    "last resort" would print them anyway) and stop propagating to the root's.
    """
    if verbose:
        yield
        return
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
        handler: logging.Handler = logging.FileHandler(os.path.join(log_dir, "agent.log"))
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    else:
        handler = logging.NullHandler()
    loggers = [logging.getLogger(name) for name in _TORCH_LOGGERS]
    saved = [lg.propagate for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.propagate = False
    try:
        yield
    finally:
        for lg, propagate in zip(loggers, saved):
            lg.removeHandler(handler)
            lg.propagate = propagate
        handler.close()


def _threads_note(config: Any, environ: Mapping[str, str], nodes_here: int = 1) -> str:
    """``, OMP_NUM_THREADS=N`` and who chose N, from the environment the launch began in.

    Read before :func:`_workers_environ` adds shoal's own value (which the start lines, printed
    while the workers start, would otherwise see as the user's). A value already set was the
    user's, unless this process runs inside a torchrun worker: torchrun sets 1 unless it was set.
    ``nodes_here``: nodes whose workers share these cores (:attr:`RendezvousPlan.nodes_here`); when
    several, the note says N counts them all.
    """
    value = environ.get("OMP_NUM_THREADS")
    if value is None:
        workers = config.nproc_per_node * nodes_here
        note = f", OMP_NUM_THREADS={threads_per_process(workers)}"
        if nodes_here > 1:
            note += f" ({usable_cores()} cores for the {nodes_here} nodes' {workers} workers on this machine)"
        return note
    if "TORCHELASTIC_RUN_ID" in environ:
        return f", OMP_NUM_THREADS={value} (inherited through torchrun)"
    return f", OMP_NUM_THREADS={value} (yours)"


def _on_start(launch: Launch, config: Any, env: dict[str, str], failed: Mapping[int, str]) -> None:
    """One line per (re)start of the workers, from local rank 0's environment, after the previous
    attempt's first failure (``failed``: its error files); the previous attempt's progress records go."""
    if launch.watch is not None:
        launch.watch.new_attempt()
    restart = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
    cause = first_recorded_failure(failed) if restart else None
    if cause:  # the workers' tracebacks go to their error files only: this one is said here, once
        write_line(cause)
    first, nproc = int(env["RANK"]), config.nproc_per_node
    ranks = f"rank {first}" if nproc == 1 else f"ranks {first}-{first + nproc - 1}"
    changes = MEMBERSHIP.get(launch.plan.run_id, [])
    change = changes[-1] if len(changes) > launch.changes_seen else None
    launch.changes_seen = len(changes)
    if change is not None:  # an elastic job lost or gained nodes: one line says which and what now
        counted = f"; restart {restart} of {config.max_restarts}" if restart else ""
        why = f"{change.describe()}: the job goes on with {change.nodes} nodes ({env['WORLD_SIZE']} workers){counted}; "
    elif restart:
        why = f"restarting the workers (restart {restart} of {config.max_restarts}): "
    elif launch.starts:
        # Another node failed and restarted, or joined (elastic): torch restarts every node's
        # workers, without counting it against this node's restarts.
        why = "the other nodes changed (one restarted or joined): "
    else:
        why = ""
    launch.starts.append(restart)
    if launch.plan.single_node:
        if not (launch.announce_single_node or restart):
            return
        workers = f"{nproc} worker{'s' if nproc != 1 else ''}"
        rendezvous = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
        picked = "" if launch.plan.workers_port else " (free port picked)"
        restarting = f"restarting the workers (restart {restart} of {config.max_restarts}), " if restart else ""
        write_line(
            f"{launch.prog}: {restarting}{workers} on this node, rendezvous {rendezvous}{picked}"
            f"{launch.threads_note}, listening on {launch.plan.bind_addr} only"
        )
        return
    write_line(f"{launch.prog}: {why}rendezvous done; starting {ranks} of {env['WORLD_SIZE']}")
