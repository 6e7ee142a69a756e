"""A training job seen from the process that starts it: ``shoal train`` and ``shoal.fit`` call
:func:`run_training` with a config and launch options.

It checks what would otherwise fail N times over in the workers, prepares (or downloads) the data
once, decides how workers start and where the run directory is, then trains in this process or
starts this node's workers through :func:`shoal.launch.local.launch_local`.

Fork safety of this process. Forked workers inherit it as it is, so before the launch it must not
have

* run a torch operation on more than one intra-op thread: GNU libgomp (torch's OpenMP on Linux) is
  not fork-safe, and a child whose parent has started its thread pool hangs in its first parallel
  region (tests/train/test_train_fork.py shows it). What runs here: the config, the environment, the
  workload's ``prepare()``, the device check, ``import torch._dynamo`` for the workers
  (:func:`_import_for_forked_workers`) and the run directory: no torch computation, except
  torchvision's MNIST reader when ``--download`` fetches the files (it converts the labels with
  ``.long()``, a parallel op on 60,000 elements); :func:`_fork_safe` makes any such op run on this
  thread alone.
* initialised CUDA: the CUDA driver does not survive fork. ``torch.cuda.is_available()`` calls
  cudaGetDeviceCount (which runs cuInit) unless ``PYTORCH_NVML_BASED_CUDA_CHECK=1``, with which it
  counts devices through NVML and leaves the driver alone; :func:`shoal.distributed.device.workers_device` sets it for its
  check. With CUDA the workers are spawned anyway; this matters for CPU runs on a machine with GPUs.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.checkpoint.files import list_checkpoints
from shoal.distributed.device import workers_device
from shoal.errors import ShoalError
from shoal.launch.core import PREEMPTED_CODES, WorkersFailed
from shoal.launch.local import Placement, launch_local, placement, resolve_start_method
from shoal.launch.options import LaunchOptions
from shoal.train.config import TrainConfig, check_resume
from shoal.train.entry import train_rank
from shoal.train.outputs import RunOutputs, default_out_dir, prepare_out_dir, refuse_existing_run
from shoal.train.trainer import TrainResult, train
from shoal.workloads import get_workload, label, short_name
from shoal.workloads.blame import blame
from shoal.workloads.spec import Parcel

if TYPE_CHECKING:
    from shoal.workloads.base import Workload


def fit(workload: str | Workload = "digits", **options: Any) -> TrainResult:
    """Train a workload, as ``shoal train`` does; return its result.

    ``workload``: a bundled name (``"digits"``), a spec (``"pkg.module:Name"``,
    ``"path/to/file.py:Name"``), or an instance of your :class:`shoal.Workload` subclass (forked
    workers inherit it; spawned ones, as on CUDA, get it pickled). docs/WORKLOADS.md.

    ``options`` are ``shoal train``'s flags as keyword arguments (``epochs=3``, ``nproc=2``,
    ``out="runs/x"``, ``nnodes=2``...). With ``nproc`` above 1 (or several nodes) this process
    starts the workers itself, through torch's elastic agent: no torchrun needed, in a notebook or a
    Flyte task too. Started as one rank of a job (torchrun, srun, mpirun, a pod), it is that rank.
    In a Kubeflow pod the operator's variables give the launch options' defaults.

    Returns the :class:`~shoal.train.trainer.TrainResult` of global rank 0 (``.metrics``,
    ``.accuracies``, ``.model_path``, ``.run_dir``, ``.config``); a rank other than 0 gets its own.
    Raises ShoalError for bad input and for a failed job (with the failing rank's traceback).
    """
    import dataclasses as dc

    config_fields = {f.name for f in dc.fields(TrainConfig)}
    launch_fields = {f.name for f in dc.fields(LaunchOptions)}
    unknown = sorted(set(options) - config_fields - launch_fields)
    if unknown:
        raise ShoalError(
            f"shoal.fit got unknown option(s): {', '.join(unknown)}",
            "use shoal train's flags as keyword arguments, e.g. epochs=3, nproc=2 (see `shoal train --help`)",
        )
    instance = None if isinstance(workload, str) else get_workload(workload)
    spec = workload if instance is None else label(instance)
    cfg = TrainConfig(workload=spec, **{k: v for k, v in options.items() if k in config_fields})
    check_resume(cfg.resume)
    launch = LaunchOptions.from_environment({k: v for k, v in options.items() if k in launch_fields})
    result = run_training(cfg, launch, workload=instance)
    if result is None:  # this node ran no rank 0 (another node of the job did)
        raise ShoalError("this node ran no rank 0 of the job: its result is on node 0", "read the run directory there")
    return result


def run_training(cfg: TrainConfig, options: LaunchOptions, *, workload: Workload | None = None) -> TrainResult | None:
    """Train with ``cfg`` here, or on this node's workers; rank 0's result when it runs on this node.

    ``workload``: the instance to train; default, the one ``cfg.workload`` names (imported here,
    so a bad spec fails before any worker starts, and again in each spawned worker). ``cfg`` is
    resolved here, once; its ``--resume`` was checked by the caller (``shoal train`` before torch
    loads, :func:`fit`). Raises ShoalError for bad input before any worker starts, and for a failed run.
    """
    given = workload
    workload = get_workload(workload if workload is not None else cfg.workload)
    cfg = cfg.resolved(workload)  # once, here: every rank gets the resolved config
    if cfg.fault_tolerance:  # replica groups beside a lighthouse (docs/FAULT_TOLERANCE.md)
        from shoal.train.ft.job import plan_replica_job, run_replica_job

        plan = plan_replica_job(
            options, nproc_per_group=cfg.nproc_per_group, strategy=cfg.strategy, device=cfg.device, backend=cfg.backend
        )
        with _fork_safe():
            _prepare(workload, cfg)
        if plan.start_method == "fork":
            _import_for_forked_workers()
        return run_replica_job(cfg, plan, workload=_carried(workload, given, cfg, plan.start_method))
    where = placement(options)
    # What --out holds, judged before any worker (or this process's training) starts; a rank of a
    # job another launcher started leaves it to the trainer, which says it once, from rank 0.
    if cfg.out is not None and where is not Placement.RANK:
        done = _finished_run(cfg)
        if done is not None:
            return done
    if where is not Placement.WORKERS:
        _prepare(workload, cfg)
        return train(cfg, workload=workload)
    # The data is present (or downloaded) before the workers start, which may be forked from here.
    with _fork_safe():
        _prepare(workload, cfg)
    device = workers_device(cfg.device, options.nproc, spawned=options.start_method == "spawn")
    method = resolve_start_method(options.start_method, device.type)
    if method == "fork":
        _import_for_forked_workers()
    if cfg.out is None:
        if options.several_nodes:
            # A name made up per attempt would change on every restart, and a restarted group must
            # find the checkpoints of the one before.
            raise ShoalError(
                "a multi-node shoal train needs --out",
                "pass --out DIR on storage every node can see (checkpoints and resume live there)",
            )
        cfg = cfg.replace(out=default_out_dir(short_name(cfg.workload)))
    cfg = cfg.replace(out=str(prepare_out_dir(cfg.out)))  # the workers get it named, prepared and expanded
    record = dataclasses.asdict(options)
    # The watchdog's progress records and hang reports go to the run directory (`shoal status
    # RUN_DIR`) on one node. Across nodes --out is shared storage that each node's launcher would
    # clear and read as its own: they stay in each launcher's log directory (`shoal status` finds it).
    run_dir = None if options.several_nodes else cfg.out
    try:
        results = launch_local(
            train_rank,
            (cfg, method, record, _carried(workload, given, cfg, method)),
            options=dataclasses.replace(options, start_method=method),
            run_dir=run_dir,
            command="shoal train",
        )
    except WorkersFailed as err:
        err.message += _resume_note(cfg, err)
        raise
    return results.get(0)


def _carried(workload: Workload, given: Workload | None, cfg: TrainConfig, method: str) -> Any:
    """What the workers get of the workload: forked ones inherit the instance; spawned ones import
    the spec again (None), or unpickle the instance they were given after importing its class's file."""
    if method == "fork":
        return workload
    return Parcel.of(given, cfg.workload) if given is not None else None


def _resume_note(cfg: TrainConfig, err: WorkersFailed) -> str:
    """After a signal (Ctrl-C, a worker killed or lost): a line saying that the same command
    resumes, when the run has a checkpoint to resume from; nothing otherwise. After SIGTERM or
    SIGUSR1 (to the launcher or to the workers) the workers were preempted and said where their
    checkpoint went and that the same command resumes: said once, not again here."""
    if err.exit_code <= 128 or err.exit_code in PREEMPTED_CODES:
        return ""
    out = Path(cfg.out or "").expanduser()
    directory = Path(cfg.checkpoint_dir).expanduser() if cfg.checkpoint_dir else out / "checkpoints"
    found = list_checkpoints(directory)
    if not found:
        return ""
    return f"\nshoal: run the same command again to resume from {found[-1]}"


def _finished_run(cfg: TrainConfig) -> TrainResult | None:
    """What the workers would find in ``--out``, checked before they start: a run that cannot be
    resumed is refused (:func:`~shoal.train.outputs.refuse_existing_run`); a complete one is said
    to be and returned. None: the workers start (a new run, or one to resume).

    The same rules as :meth:`shoal.train.run_state.RunState.resume`, read from the files alone:
    a run that logged epochs or finished, without a checkpoint to resume from, would lose results;
    one whose model is saved and whose metrics reach ``--epochs`` has nothing left to do.
    """
    outputs = RunOutputs(Path(cfg.out).expanduser())
    if not outputs.started or cfg.resume not in ("auto", "never"):
        return None
    if cfg.resume == "never":
        refuse_existing_run(outputs.directory, "previous")
    logged = outputs.logged_epochs()
    directory = Path(cfg.checkpoint_dir).expanduser() if cfg.checkpoint_dir else outputs.directory / "checkpoints"
    if not list_checkpoints(directory):
        if outputs.finished or logged:
            refuse_existing_run(outputs.directory, "finished" if outputs.finished else "previous")
        return None
    if not outputs.finished or max((int(r.get("epoch", 0)) for r in logged), default=0) < (cfg.epochs or 0):
        return None
    epochs = f"{cfg.epochs} epoch{'s' if cfg.epochs != 1 else ''}"
    print(f"shoal: the run in {outputs.directory} is already complete ({epochs}): nothing to do", flush=True)
    return TrainResult(run_dir=outputs.directory, metrics=logged, model_path=outputs.model_path, config=cfg)


def _prepare(workload: Workload, cfg: TrainConfig) -> None:
    with blame(workload, "prepare()", "fix the error in your workload's prepare() at that line"):
        workload.prepare(cfg)


def _import_for_forked_workers() -> None:
    """Import here, once, what every worker's first step imports: forked workers inherit it.

    DDP's constructor and every ``optimizer.step()`` import ``torch._dynamo``
    (torch/nn/parallel/distributed.py, torch/optim/optimizer.py); the launcher has most of what it
    needs already, the rest costs each worker about 0.4 s of CPU (docs/BENCHMARKS.md, "Start-up").
    With torch 2.15 the import starts no thread; it runs under :func:`_fork_safe` all the same, so
    that a release that computes at import cannot leave a thread pool for the workers to inherit.
    """
    with _fork_safe():
        import torch._dynamo  # noqa: F401


@contextlib.contextmanager
def _fork_safe() -> Iterator[None]:
    """Run torch operations in this block on the calling thread only (no OpenMP thread pool)."""
    import torch

    threads = torch.get_num_threads()
    if threads > 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if threads > 1:
            torch.set_num_threads(threads)  # what the workers inherit (and then set their own)
