"""``shoal.run(fn, *args, nproc=N)``: your own function on N workers, with the process group ready.

The library twin of ``shoal run SCRIPT`` (and of ``mp.spawn``, Accelerate's ``notebook_launcher``,
Fabric's ``launch``), for a notebook, a REPL or a Flyte task. It is :func:`shoal.fit`'s launch
without the trainer: the same launch options (``nproc``, ``nnodes``, ``node_rank``, ``master_addr``,
``rdzv_*``, ``max_restarts``, ``start_method``...), the same launcher
(:func:`shoal.launch.local.launch_local`: torch's elastic agent, fork on CPU, spawn with CUDA), the
same failure report (the failing rank's own traceback), the same decision
(:func:`shoal.launch.local.placement`) for a process that is already one rank of someone else's job
(torchrun, srun, mpirun, a pod): it runs ``fn`` itself, as that rank.

Each worker calls :func:`shoal.init` (``shoal.current()`` or ``shoal.init()`` in ``fn`` return that
context), then ``fn(*args, **kwargs)``, waits for the other ranks, and leaves the group.

Checked before any worker starts, each as one line and a hint: an unknown option; for spawned
workers, a function they could not unpickle (a lambda, a closure, a function typed into a notebook);
for forked ones, a process whose GNU OpenMP pool would hang them (:func:`_check_fork_safe`).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from shoal.context import current, init
from shoal.distributed.device import workers_device
from shoal.errors import ShoalError, first_line
from shoal.launch.local import Placement, launch_local, placement, resolve_start_method
from shoal.launch.options import LaunchOptions
from shoal.train.entry import peer_gone

_LAUNCH_OPTIONS = frozenset(f.name for f in dataclasses.fields(LaunchOptions))
_INIT_OPTIONS = frozenset({"device", "backend", "seed", "init_timeout", "timeout", "threads"})
_VICTIM_WAIT_S = 2.0
"""How long a rank whose collective failed because a peer is gone waits before it exits (see _run_call)."""


def run(
    fn: Callable[..., Any],
    *args: Any,
    kwargs: Mapping[str, Any] | None = None,
    all_ranks: bool = False,
    fault_tolerance: bool = False,
    lighthouse: str | None = None,
    nproc_per_group: int = 1,
    **options: Any,
) -> Any:
    """Run ``fn(*args, **kwargs)`` on every rank of a job, each with the process group joined.

    Args:
        fn: the function every rank runs. With spawned workers (CUDA, or ``start_method="spawn"``)
            it and its arguments are pickled: a module-level function of an importable module, not
            a lambda or a function defined in a notebook (with fork, on CPU, anything goes).
        args: ``fn``'s positional arguments; ``kwargs``: its keyword arguments, as a mapping.
        all_ranks: return every rank's value, as a list ordered by global rank (gathered through
            the process group, so every node and every rank gets the whole list).
        options: launch options, as ``shoal.fit`` takes them (``nproc=2``, ``nnodes=2``,
            ``node_rank=1``, ``master_addr=...``, ``rdzv_backend``, ``rdzv_endpoint``, ``rdzv_id``,
            ``join_timeout``, ``max_restarts``, ``start_method``, ``verbose``, ``local_addr``...),
            and :func:`shoal.init`'s options for each rank (``device``, ``backend``, ``seed``,
            ``init_timeout``, ``timeout``, ``threads``). In a Kubeflow pod the operator's variables
            give the launch options' defaults.
        fault_tolerance: run ``nproc`` replica groups of one process each beside a torchft
            lighthouse instead of one job: each worker is a world of one, and ``fn`` trains through
            ``shoal.current().replicas(model, optimizer)``; a failed group is restarted alone and
            heals from a live one (docs/FAULT_TOLERANCE.md). ``lighthouse``: the URL of a
            lighthouse someone else runs (default: one started here). ``nproc_per_group``: K
            processes per group (``nproc / K`` groups), each group a process group of its own
            (wrap the model for it with ``ctx.wrap``, DDP or FSDP: HSDP).

    Returns:
        Global rank 0's return value (the values of the other ranks are dropped; they must be
        picklable all the same, as they travel back from the workers). A node of a multi-node job
        that holds no rank 0 gets None. Started as one rank of a job (torchrun, srun, mpirun, a
        pod), this process is that rank and gets its own ``fn``'s value; launch options that
        disagree with that launcher's (``nproc=4`` under ``torchrun --nproc-per-node 2``) are
        refused, as ``shoal train`` refuses them. With ``all_ranks``: every rank's value.

    Raises:
        ShoalError: an unknown option, a function spawned workers cannot unpickle (before any worker
            starts), or a failed rank (its traceback and a summary line; the other workers stopped).
    """
    unknown = sorted(set(options) - _LAUNCH_OPTIONS - _INIT_OPTIONS)
    if unknown:
        raise ShoalError(
            f"shoal.run got unknown option(s): {', '.join(unknown)}",
            "pass fn's own keyword arguments as kwargs={...}; options are launch options (nproc=2, "
            "nnodes, master_addr, max_restarts, start_method...) and shoal.init's (device, seed...)",
        )
    if not callable(fn):
        raise ShoalError(
            f"shoal.run needs a function to run, got {type(fn).__name__}", "pass it first: shoal.run(fn, ...)"
        )
    call = _Call(
        fn, tuple(args), dict(kwargs or {}), {k: v for k, v in options.items() if k in _INIT_OPTIONS}, all_ranks
    )
    if fault_tolerance:
        return _run_replica_groups(call, options, lighthouse, nproc_per_group)
    launch = LaunchOptions.from_environment({k: v for k, v in options.items() if k in _LAUNCH_OPTIONS})
    if placement(launch) is not Placement.WORKERS:  # one process, or already one rank of a job: fn runs here
        return call()[1]
    method = resolve_start_method(launch.start_method, _workers_device_type(call, launch))
    if method == "spawn":
        _check_picklable(call)
    else:
        _check_fork_safe(_worker_threads(call.init_options.get("threads"), launch.nproc))
    results = launch_local(_run_call, (call,), options=dataclasses.replace(launch, start_method=method))
    by_rank = dict(results.values())  # {global rank: value} of this node's ranks
    if all_ranks:
        return next(iter(by_rank.values()))
    return by_rank.get(0)


@dataclasses.dataclass(frozen=True)
class _Call:
    """What every rank runs: join the group, ``fn(*args, **kwargs)``, leave; ``(rank, value)``."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    init_options: dict[str, Any]
    all_ranks: bool

    def __call__(self) -> tuple[int, Any]:
        joined = current() is None  # a context the caller made stays the caller's
        ctx = init(**self.init_options)
        value = self.fn(*self.args, **self.kwargs)
        if self.all_ranks:
            value = _gather(value, ctx.world_size)
        # Left only after a success: a rank that raised keeps its connections open until it exits,
        # so that the others fail after it, and the report names it rather than a peer that lost it.
        if joined:
            if ctx.world_size > 1:
                # Nobody closes its connections before every rank is done: init_process_group can
                # return on one rank while a slower one is still connecting its gloo pairs, and an fn
                # with no collective would leave at once ("Connection closed by peer" there).
                ctx.barrier()
            ctx.shutdown()
        return ctx.rank, value


def _run_replica_groups(call: _Call, options: Mapping[str, Any], lighthouse: str | None, nproc_per_group: int) -> Any:
    """``fn`` as ``nproc / nproc_per_group`` replica groups (:mod:`shoal.train.ft.supervisor`);
    group 0's value (its rank 0's), or every group's with ``all_ranks`` (each group's rank 0's)."""
    from shoal.distributed.torchft_check import check_torchft
    from shoal.train.ft.job import plan_replica_job
    from shoal.train.ft.supervisor import DEFAULT_MAX_RESTARTS, run_replica_groups

    launch = LaunchOptions.from_environment({k: v for k, v in options.items() if k in _LAUNCH_OPTIONS})
    device, backend = call.init_options.get("device", "auto"), call.init_options.get("backend", "auto")
    plan = plan_replica_job(launch, nproc_per_group=nproc_per_group, device=device, backend=backend)
    check_torchft()
    # Every group computes on what was decided here (auto would decide again in each process).
    call = dataclasses.replace(call, init_options={**call.init_options, "device": plan.device})
    if plan.start_method == "spawn":
        _check_picklable(call)
    else:
        _check_fork_safe(_worker_threads(call.init_options.get("threads"), launch.nproc))
    results = run_replica_groups(
        _run_call, (call,), groups=plan.groups, group_nproc=plan.group_nproc, lighthouse=lighthouse,
        max_restarts=launch.max_restarts or DEFAULT_MAX_RESTARTS, start_method=plan.start_method, gpus=plan.gpus,
    )  # fmt: skip
    if call.all_ranks:
        return [results[group][1][0] for group in sorted(results)]
    return results[0][1] if 0 in results else None


def _run_call(call: _Call) -> tuple[int, Any]:
    """The workers' entry point (module-level: spawned workers unpickle it by name).

    A forked worker inherits the launcher's context, if it made one: a one-process context, not
    this worker's (it holds no process group, so leaving it touches nothing the launcher has).
    """
    inherited = current()
    if inherited is not None:
        inherited.shutdown()
    try:
        return call()
    except Exception as err:
        if peer_gone(err):
            # The launcher reports the worker it sees exit first; it looks every 0.1 s, and the
            # rank whose fn raised is still exiting when its peers' collectives fail. A victim
            # waits, so that the report names the cause (the agent stops the victim meanwhile).
            time.sleep(_VICTIM_WAIT_S)
        raise


def _gather(value: Any, world_size: int) -> list[Any]:
    import torch.distributed as dist

    if world_size == 1 or not dist.is_initialized():
        return [value]
    values: list[Any] = [None] * world_size
    dist.all_gather_object(values, value)
    return values


def _worker_threads(threads: int | None, nproc: int) -> int:
    """The intra-op threads each worker will use (as shoal.init's configure_threads decides)."""
    from shoal.env.host import threads_per_process

    if threads is not None:
        return threads
    env = os.environ.get("OMP_NUM_THREADS", "")
    return int(env) if env.isdigit() and int(env) > 0 else threads_per_process(nproc)


def _check_fork_safe(threads: int, timeout_s: float = 10.0) -> None:
    """Fail in one line where forked workers would hang: this process ran a parallel torch
    operation (its GNU OpenMP thread pool exists), and a child of it hangs in its first parallel
    region (tests/train/test_train_fork.py shows the hazard). A notebook that built or ran a model
    before calling shoal.run is in that state. Nothing to check when the workers use one thread;
    otherwise a forked probe runs one small parallel operation, within ``timeout_s``.
    """
    if threads < 2 or "torch" not in sys.modules:
        return
    import torch

    pid = os.fork()
    if pid == 0:  # the probe: exit 0 once a parallel region has run
        try:
            torch.set_num_threads(threads)
            torch.ones(1 << 17).exp_()  # several grains of at::parallel_for: every thread of the pool
        finally:
            os._exit(0)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise ShoalError(
        f"shoal.run cannot fork workers with {threads} threads each: this process already ran torch "
        "operations on several threads, and GNU OpenMP's pool does not survive a fork (they would hang)",
        "call shoal.run before any torch computation in this process (a fresh kernel), or set "
        "torch.set_num_threads(1) first thing, or pass threads=1, or start_method='spawn' with fn in a .py module",
    )


def _check_picklable(call: _Call) -> None:
    """Fail here, in one line, for what spawned workers could not unpickle (instead of N tracebacks)."""
    hint = (
        "define the function at the top level of a .py module and import it (spawned workers import "
        "it by name); on CPU, start_method='fork' runs any function"
    )
    name = getattr(call.fn, "__qualname__", repr(call.fn))
    module = getattr(call.fn, "__module__", None)
    main = sys.modules.get("__main__")
    if module == "__main__" and not getattr(main, "__file__", None):
        raise ShoalError(f"shoal.run cannot spawn workers for {name}: it was defined in a notebook or REPL", hint)
    try:
        pickle.dumps(call.fn)
    except Exception as err:
        raise ShoalError(
            f"shoal.run cannot spawn workers for {name}: it cannot be pickled ({first_line(err)})", hint
        ) from None
    try:
        pickle.dumps((call.args, call.kwargs, call.init_options))
    except Exception as err:
        raise ShoalError(
            f"shoal.run cannot spawn workers: an argument of {name} cannot be pickled ({first_line(err)})",
            "pass picklable arguments (tensors, data classes, paths), or use start_method='fork' on CPU",
        ) from None


def _workers_device_type(call: _Call, launch: LaunchOptions) -> str:
    spawned = launch.start_method == "spawn"
    return workers_device(call.init_options.get("device", "auto"), launch.nproc, spawned=spawned).type
