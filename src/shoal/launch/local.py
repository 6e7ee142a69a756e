"""Start N local worker processes running a Python function, through torch's elastic agent.

This is what ``shoal train --nproc N`` uses: the same agent as torchrun (c10d rendezvous on a
port the OS picks, worker monitoring, the rest of the group stopped when one worker fails), with
a function as entrypoint so the workers need no command line of their own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from shoal.errors import ShoalError

if TYPE_CHECKING:
    from shoal.launch.rendezvous import RendezvousOptions, RendezvousPlan


START_METHODS = ("auto", "fork", "spawn")


def check_start_method(name: str) -> str:
    if name not in START_METHODS:
        raise ShoalError(f"unknown start method {name!r}", f"use one of: {', '.join(START_METHODS)}")
    return name


def resolve_start_method(name: str, device_type: str) -> str:
    """``auto``: fork on CPU (workers inherit the parent's imports: seconds saved per launch on a
    small machine, see ``shoal bench startup``), spawn with CUDA (a CUDA runtime does not survive fork)."""
    check_start_method(name)
    if name != "auto":
        return name
    return "spawn" if device_type == "cuda" else "fork"


# Exit statuses of workers that stopped for SIGTERM / SIGUSR1 (see shoal.preemption).
_PREEMPTED_CODES = {128 + signal.SIGTERM, 128 + signal.SIGUSR1}


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@contextlib.contextmanager
def _fresh_store_per_attempt() -> Iterator[None]:
    """Give every restart attempt its own store (unless the user decided otherwise).

    By default torch's c10d rendezvous lets the workers share the agent's store across restarts,
    and a restarted rank can then read the previous attempt's keys (the old rank 0's gloo
    address) and time out connecting to it: pytorch/pytorch#135712. Seen here with
    ``--max-restarts 1`` after a SIGKILLed worker.
    """
    name = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
    if name in os.environ:
        yield
        return
    os.environ[name] = "1"
    try:
        yield
    finally:
        os.environ.pop(name, None)


@contextlib.contextmanager
def _environ_restored(*names: str) -> Iterator[None]:
    """Undo what torch's launcher writes into this process's environment (a library call that
    launches workers should leave its caller's environment as it was)."""
    saved = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class WorkersFailed(ShoalError):
    """Some local worker failed; the message already holds its traceback and summary."""

    def format(self) -> str:
        return self.message


def launch_local(
    entrypoint: Callable[..., Any],
    args: tuple[Any, ...],
    nproc: int,
    *,
    max_restarts: int = 0,
    start_method: str = "spawn",
    rendezvous: RendezvousOptions | None = None,
) -> dict[int, Any]:
    """Run ``entrypoint(*args)`` in ``nproc`` worker processes on this machine and wait for them.

    Returns ``{rank: return value}`` for this node's workers. A failed worker raises
    :class:`WorkersFailed` carrying the failing rank's own traceback; the other workers are stopped
    by the agent first.

    ``start_method``: ``spawn`` (fresh interpreters that import everything again) or ``fork``
    (copies of this process: seconds sooner to the first step, but this process must not have run
    torch work on several threads or initialised CUDA first; ``shoal train`` picks with
    :func:`resolve_start_method`: fork on CPU, spawn with CUDA).

    ``rendezvous``: this node is one of several (see :mod:`shoal.launch.rendezvous`): the workers
    join the others through that rendezvous, with the interface, address and timeouts shoal picks
    (printed at start); one that cannot complete raises a ShoalError saying why.
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from shoal.launch.failures import describe_child_failure

    if nproc < 1:
        raise ShoalError(f"--nproc must be at least 1, got {nproc}", "pass --nproc 1 or more")
    if start_method not in ("spawn", "fork", "forkserver"):
        raise ShoalError(f"unknown start method {start_method!r}", "use fork or spawn")
    log_dir = tempfile.mkdtemp(prefix="shoal-workers-")
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"shoal-{uuid.uuid4().hex[:8]}",
        # c10d on port 0: the agent's store binds a port the OS picks, so concurrent jobs on one
        # machine never collide (what torchrun --standalone does).
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        max_restarts=max_restarts,
        monitor_interval=0.1,
        start_method=start_method,
        logs_specs=DefaultLogsSpecs(log_dir=log_dir),
    )
    plan = None
    try:
        if rendezvous is not None:
            plan = _join_nodes(config, rendezvous)
        # Forked workers start with a copy of this process's unwritten output buffers: empty
        # them first, so nothing printed before the launch comes out once per worker.
        sys.stdout.flush()
        sys.stderr.flush()
        with _fresh_store_per_attempt(), _worker_environ(plan), _environ_restored("TORCHELASTIC_SIGNALS_TO_HANDLE"):
            return elastic_launch(config, entrypoint)(*args)
    except ChildFailedError as err:
        codes = {failure.exitcode for failure in err.failures.values()}
        if codes and codes <= _PREEMPTED_CODES:
            # Every worker stopped for a preemption signal: they said so (and where the
            # checkpoint went) themselves; a traceback report would only bury that.
            code = max(codes)
            raise WorkersFailed(f"shoal: workers stopped by {_signal_name(code - 128)}", exit_code=code) from None
        report = describe_child_failure(err, log_dir)
        raise WorkersFailed(report.format(), exit_code=report.exit_code) from None
    except SignalException as err:
        # This launcher got the signal (e.g. Kubernetes or Slurm stopping the job): the agent has
        # forwarded it to the workers, which checkpoint and exit.
        raise WorkersFailed(
            f"shoal: stopped by {_signal_name(int(err.sigval))}; the workers checkpointed on the way out",
            exit_code=128 + int(err.sigval),
        ) from None
    except Exception as err:
        from shoal.launch.rendezvous import explain_failure, is_rendezvous_failure

        if plan is not None and is_rendezvous_failure(err):
            raise explain_failure(err, plan) from None
        raise
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
        sys.stdout.flush()


def _join_nodes(config: Any, rendezvous: RendezvousOptions) -> RendezvousPlan:
    """Turn the single-node ``config`` into this node's part of a multi-node launch.

    Checks what can be checked before anything starts (addresses, route, the store's port) and
    prints what was chosen.
    """
    from shoal.launch.rendezvous import check_store_port, plan_rendezvous, register_backends
    from shoal.launch.run import _recording_logs_specs

    plan = plan_rendezvous(rendezvous)
    check_store_port(plan)
    config.min_nodes, config.max_nodes = plan.min_nodes, plan.max_nodes
    config.run_id = rendezvous.run_id
    config.rdzv_endpoint = plan.endpoint
    plan.configure(config)
    register_backends()
    print("\n".join(plan.lines("shoal", config.nproc_per_node)), file=sys.stderr, flush=True)
    starts = []

    def on_start(env: dict[str, str]) -> None:  # local rank 0's environment, at each (re)start
        first, last = int(env["RANK"]), int(env["RANK"]) + config.nproc_per_node - 1
        ranks = f"rank {first}" if first == last else f"ranks {first}-{last}"
        restart = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
        why = (
            f"restart {restart} of {config.max_restarts}: "
            if restart
            else ("the other nodes changed: " if starts else "")
        )
        starts.append(restart)
        print(f"shoal: {why}rendezvous done; starting {ranks} of {env['WORLD_SIZE']}", file=sys.stderr, flush=True)

    config.logs_specs = _recording_logs_specs(config.logs_specs, tee=False, on_start=on_start)
    return plan


@contextlib.contextmanager
def _worker_environ(plan: RendezvousPlan | None) -> Iterator[None]:
    """Export the plan's variables (socket interfaces, join timeout) to the workers, then restore."""
    extra = {k: v for k, v in (plan.environ if plan else {}).items() if k not in os.environ}
    os.environ.update(extra)
    try:
        yield
    finally:
        for key in extra:
            os.environ.pop(key, None)
