"""Start this node's workers running a Python function, and decide whether to start any at all.

- :func:`placement`: the one decision between running the job in this process (one process, or
  this process is already a rank that torchrun, srun, mpirun or a pod started) and starting this
  node's workers, with one set of errors for ``shoal train``, ``shoal.fit``, ``shoal.run``, ``shoal
  demo`` and the doctor.
- :func:`launch_local`: ``entrypoint(*args)`` in N worker processes through torch's elastic agent
  (the machinery behind torchrun: worker monitoring, the rest of the group stopped when one fails,
  restarts), joining other nodes when the options say so; its workers need no command line.
- :func:`run_here_or_launch`: both, for an entrypoint that needs nothing between the decision and
  the launch (``shoal demo``, the doctor, ``shoal.run``); ``shoal train`` prepares its data, device
  and run directory in between (``shoal.train.job``).
"""

from __future__ import annotations

import dataclasses
import enum
import os
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from shoal.console import write_line
from shoal.env import detect_environment
from shoal.env.detect import detected_scheme
from shoal.env.local import LocalEnvironment
from shoal.env.operator import classic_pod, classic_pod_line
from shoal.env.slurm import allocation_beyond
from shoal.errors import ShoalError
from shoal.launch.core import Launch, WorkersFailed, run_workers
from shoal.launch.options import LaunchOptions
from shoal.launch.process import temporary_run_dir
from shoal.launch.rendezvous import plan_for
from shoal.shape import check_start_method

__all__ = [
    "Placement",
    "WorkersFailed",
    "check_allocation",
    "check_start_method",
    "launch_local",
    "placement",
    "refuse_rank_launching_alone",
    "resolve_start_method",
    "run_here_or_launch",
]


def resolve_start_method(name: str, device_type: str) -> str:
    """``auto``: fork on CPU (workers inherit the parent's imports: seconds saved per launch on a
    small machine, see ``benchmarks/startup.py``), spawn with CUDA (a CUDA runtime does not survive fork)."""
    check_start_method(name)
    if name != "auto":
        return name
    return "spawn" if device_type == "cuda" else "fork"


def launch_local(
    entrypoint: Callable[..., Any],
    args: tuple[Any, ...],
    nproc: int = 1,
    *,
    max_restarts: int = 0,
    start_method: str = "spawn",
    options: LaunchOptions | None = None,
    run_dir: str | os.PathLike | None = None,
    command: str = "shoal",
) -> dict[int, Any]:
    """Run ``entrypoint(*args)`` in worker processes on this node and wait for them.

    Either ``nproc``/``max_restarts``/``start_method`` (workers on this machine only), or
    ``options`` (which may also join other nodes; its ``start_method`` must not be ``auto``: see
    :func:`resolve_start_method`). Returns ``{local rank: return value}`` for this node's workers.

    ``start_method``: ``spawn`` (fresh interpreters that import everything again) or ``fork``
    (copies of this process: seconds sooner to the first step, but this process must not have run
    torch work on several threads or initialised CUDA first).

    ``run_dir``: the run's directory (``shoal train``'s ``--out``): the workers' progress goes to
    ``RUN_DIR/progress`` (``shoal status RUN_DIR``), hang reports to ``RUN_DIR/hang-<time>/``;
    default, the launch's temporary log directory (kept only after a hang report). ``command``: what
    the user ran (``shoal train``), the workers' banner names it. The options'
    ``hang_timeout`` and ``on_hang`` drive the watchdog (docs/WATCHDOG.md).

    Raises :class:`~shoal.launch.core.WorkersFailed` carrying the failing rank's own traceback
    (the other workers are stopped by the agent first), and ShoalError when the nodes cannot meet.
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig

    if options is None:
        options = LaunchOptions(nproc=nproc, max_restarts=max_restarts, start_method=start_method)
    method = options.start_method
    if method == "auto":
        raise ShoalError("launch_local needs a start method, not auto", "pass resolve_start_method(name, device)")
    plan = plan_for(options)
    log_dir = temporary_run_dir("shoal-workers-")
    config = LaunchConfig(
        min_nodes=plan.min_nodes,
        max_nodes=plan.max_nodes,
        nproc_per_node=options.nproc,
        run_id=options.rdzv_id if options.several_nodes else f"shoal-{uuid.uuid4().hex[:8]}",
        max_restarts=options.max_restarts,
        monitor_interval=0.1,
        start_method=method,
        logs_specs=DefaultLogsSpecs(log_dir=log_dir),
        local_addr=options.local_addr,
    )
    launch = Launch(
        plan=plan, prog="shoal", command=command, log_dir=log_dir, verbose=options.verbose, run_dir=str(run_dir or ""),
        hang_timeout=options.hang_timeout, on_hang=options.on_hang,
    )  # fmt: skip
    return run_workers(config, entrypoint, args, launch)


class Placement(enum.Enum):
    """Where a job's ranks run, as seen from the process that was asked to run it."""

    ALONE = "alone"
    """In this process: a job of one process."""
    RANK = "rank"
    """In this process, as the rank another launcher (torchrun, srun, mpirun) started it as."""
    WORKERS = "workers"
    """In worker processes this process starts (and, across nodes, joins to the other nodes')."""


def placement(options: LaunchOptions, *, environ: Mapping[str, str] | None = None) -> Placement:
    """Where the job runs: :class:`Placement`. The one place that decides it.

    Started as one rank of another launcher's job, this process is that rank. Options that agree
    with that launcher (the same processes per node; as many nodes, when they name several) are
    the same job written twice, as a script that says ``nproc=2`` and runs under ``torchrun
    --nproc-per-node 2`` does; options that disagree would start a job of jobs: ShoalError. In a
    Kubernetes pod's command (``options.in_pod``: they came from the operator's variables) it
    starts the pod's workers whatever the environment says. Otherwise workers when the options ask
    for more than one process, after :func:`check_allocation`.
    """
    environ = dict(os.environ if environ is None else environ)
    if options.in_pod:
        if classic_pod(environ) and options.several_nodes:
            write_line(classic_pod_line("shoal", environ))
        return Placement.WORKERS
    env = detect_environment(environ)
    if env.world_size > 1:
        nodes = options.node_counts[1]
        if options.asks_for_workers and (options.nproc != env.local_world_size or nodes not in (1, env.num_nodes)):
            raise ShoalError(
                f"--nproc {options.nproc} --nnodes {options.nnodes} asked for, but {env.scheme} already started "
                f"this process as rank {env.rank} of {env.world_size} ({env.local_world_size} per node on "
                f"{env.num_nodes} node{'s' if env.num_nodes != 1 else ''})",
                "drop --nproc and the rendezvous flags (--nnodes, --master-addr, --rdzv-*), or make them match "
                "the launcher's: it already starts one process per rank",
            )
        return Placement.RANK
    check_allocation(options, environ)
    return Placement.WORKERS if options.asks_for_workers else Placement.ALONE


def check_allocation(options: LaunchOptions, environ: Mapping[str, str], prog: str = "shoal") -> None:
    """ShoalError when this launcher, not a rank of any launcher's job (the ``local`` scheme), starts a
    job on this node only inside a Slurm allocation (an sbatch script or an salloc shell, not an srun
    step) that asked for more: several nodes, or more tasks than the processes it starts. The job
    would run on a part of what was allocated, silently. ``SHOAL_ENV=local`` says that is intended.
    """
    if options.several_nodes or environ.get("SHOAL_ENV", "").strip():
        return
    found = allocation_beyond(environ, options.nproc)
    # Not the local scheme: an srun step (or another launcher's rank) counts its own tasks.
    if found is None or detected_scheme(environ, argv=()) is not LocalEnvironment:
        return
    raise ShoalError(
        f"{found}: this Slurm allocation asks for more than the {options.nproc} process(es) {prog} would "
        "start on this node alone (this is the batch script or an salloc shell, not an srun step)",
        "start the ranks with srun (`srun shoal train ...`: each task is a rank), or one launcher per node "
        "(`shoal launch slurm` renders it), or ask for what you start (--nproc N with --ntasks N), "
        "or SHOAL_ENV=local to run on this node only",
    )


def refuse_rank_launching_alone(prog: str, environ: Mapping[str, str]) -> None:
    """ShoalError when another launcher started this process as one rank of several while ``prog``
    would start a standalone job of its own: every copy would train alone. Called by ``shoal run``
    when it plans one node and no rendezvous was given (a launcher under srun or mpirun must be
    told where the others are)."""
    info = detect_environment(environ)
    if info.world_size <= 1:
        return
    hints = {
        "slurm": "srun started one copy per task: give srun one task per node and the launchers a rendezvous "
        "(`shoal launch slurm` renders it), or let srun start every process: `srun python SCRIPT`",
        "openmpi": "mpirun starts every process itself: `mpirun ... python SCRIPT` (each reads its rank), "
        "or run one launcher per node with --nnodes/--node-rank/--master-addr",
        "torchrun": "this process is already a torchrun worker: run the script itself, not a launcher",
    }
    hints["pmi"] = hints["openmpi"].replace("mpirun", "mpiexec")
    raise ShoalError(
        f"{info.scheme} started this process as rank {info.rank} of {info.world_size} "
        f"({' '.join(info.reason[:3])}), but {prog} would start a standalone job of its own here",
        hints.get(info.scheme, "give the launcher --nnodes, --node-rank and --master-addr of the job it belongs to"),
    )


def run_here_or_launch(
    entrypoint: Callable[..., Any],
    args: tuple[Any, ...],
    options: LaunchOptions,
    *,
    device_type: str = "cpu",
) -> dict[int, Any]:
    """Run ``entrypoint(*args)`` here, or start this node's workers for it (see :func:`placement`);
    ``{local rank: result}``."""
    if placement(options) is not Placement.WORKERS:
        return {0: entrypoint(*args)}
    method = resolve_start_method(options.start_method, device_type)
    return launch_local(entrypoint, args, options=dataclasses.replace(options, start_method=method))
