"""The training loop of ``shoal train``: reads like a table of contents; each part owns its timing. Here:
the run's setup, the loop over the epochs and its end; one epoch's work is :mod:`shoal.train.epoch`'s.

Exact resume: everything that decides the rest of the run is checkpointed (model, optimizer, AMP
scaler, the data position inside the epoch, the partial epoch sums, every rank's RNG states) and
the learning rate is a function of training progress, so a run resumed from a checkpoint, under
the same or another world size, continues exactly where it stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from shoal import __version__ as shoal_version
from shoal.checkpoint.manager import CheckpointManager
from shoal.context import Context
from shoal.context import init as init_context
from shoal.distributed.collectives import broadcast_object
from shoal.distributed.comm_hooks import powersgd_start, register_comm_hook
from shoal.distributed.wrap import model_state_dict
from shoal.errors import ShoalError
from shoal.preemption import Preempted, PreemptionWatch
from shoal.train.config import TrainConfig
from shoal.train.epoch import finish_epoch, train_epoch
from shoal.train.optim import LRSchedule, build_optimizer, scaled_lr
from shoal.train.outputs import RunOutputs, default_out_dir, prepare_out_dir
from shoal.train.reporting import Reports, first_samples
from shoal.train.run_state import RunState
from shoal.train.step import EpochTally, GeneratorState, Step, has_conv2d, in_channels_last
from shoal.workloads import short_name
from shoal.workloads.base import Workload
from shoal.workloads.blame import blame, checked_loss


@dataclass(frozen=True)
class TrainPlan:
    """Quantities derived once at start, printed so nobody has to work them out."""

    world_size: int
    batch_size: int
    grad_accum: int
    global_batch_size: int
    steps_per_epoch: int
    epochs: int
    base_lr: float
    lr: float

    def describe(self) -> str:
        return (
            f"global batch {self.global_batch_size} ({self.batch_size}/process x {self.world_size} processes"
            f" x {self.grad_accum} accumulation) | {self.steps_per_epoch} steps/epoch x {self.epochs} epochs"
            f" | lr {self.lr:g} (base {self.base_lr:g})"
        )


@dataclass(frozen=True)
class TrainResult:
    """What a training run returns (``shoal.fit``): the run directory, the epochs' metrics, the model.

    Complete on global rank 0; other ranks of a job get their run directory and the last epoch.
    """

    run_dir: Path
    metrics: list[dict[str, Any]] = field(default_factory=list)
    """One record per epoch of the whole run, as in metrics.jsonl (resumed epochs included)."""
    model_path: Path | None = None
    """``model.pt``: the unwrapped model's plain state dict (rank 0)."""
    config: TrainConfig | None = None
    """The resolved configuration."""

    @property
    def accuracies(self) -> list[float]:
        """The test accuracy of every epoch, in order (None where the workload measures none)."""
        return [record.get("test_accuracy") for record in self.metrics]


def train(
    cfg: TrainConfig,
    *,
    workload: Workload,
    started_by: str | None = None,
    launch_record: dict[str, Any] | None = None,
) -> TrainResult:
    """Run one training job in this process (one rank of it).

    ``cfg``: resolved against ``workload`` (:meth:`TrainConfig.resolved`), by the process that
    started the job (:func:`shoal.train.job.run_training`); ``workload``: the instance to train.
    ``started_by``: how a local launcher started this worker (``fork``/``spawn``);
    ``launch_record``: the launch options it was given, as a dict. Both only go on the record
    (config.json's ``launch``).
    """
    ctx = init_context(device=cfg.device, backend=cfg.backend, seed=cfg.seed)
    reports: Reports | None = None
    failed = True
    try:
        if cfg.amp == "fp16" and ctx.device.type != "cuda":
            raise ShoalError("--amp fp16 needs a CUDA device", "use --amp bf16 or --amp off on CPU")
        out, outputs, checkpoints = _open_run(cfg, ctx, prepared=started_by is not None)
        reports = Reports(cfg, ctx, out)
        # Keep this order: the data and the initial weights draw from the generators init_context seeded.
        data = _load_data(cfg, ctx, workload)
        model, channels_last = _build_model(cfg, ctx, workload, data)
        train_loader, test_loader = _loaders(cfg, ctx, data)
        plan = _train_plan(cfg, ctx, len(train_loader))
        step, schedule, comm_hook = _build_step(cfg, ctx, model, plan, checked_loss(workload))
        state, per_rank = _checkpointed(ctx, step, train_loader, data, comm_hook)
        run = RunState(cfg, ctx, plan, out, outputs, checkpoints, state, per_rank, reports)
        run.workload, run.loss_fn, run.eval_filler = workload, step.loss_fn, _eval_filler(cfg, ctx, data)
        run.resume()
        _announce(run, {"channels_last": channels_last, "start_method": started_by}, launch_record)
        record: dict[str, Any] = {}
        with PreemptionWatch(grace_s=cfg.preempt_grace) as preemption:
            while run.epoch <= plan.epochs:
                if not run.epoch_trained:
                    with blame(workload, "training", _FIX_HINT):
                        train_epoch(run, step, train_loader, schedule, preemption)
                with blame(workload, "evaluation", _FIX_HINT):
                    record = finish_epoch(run, model, test_loader, step)
                reports.epoch(record, run.global_step, model, data.test, data.test_transform, workload)
                # After the trackers got the epoch: a checkpoint says the epoch was logged, and the
                # trackers' state it holds is flushed to disk (a kill right after it loses nothing).
                run.save(epoch_end=True)
                run.next_epoch()
        result = _finish_run(run, model, record)
        failed = False
        return result
    except Preempted as err:
        err.quiet = not ctx.is_main  # the same message from every rank: print it once
        failed = False  # preempted, not failed: the trackers' runs continue on resume
        raise
    finally:
        if reports is not None:
            reports.close(failed=failed)
        ctx.shutdown()


_FIX_HINT = "fix your workload's code at that line (its Dataset, model or loss), then run the same command again"


def _open_run(cfg: TrainConfig, ctx: Context, *, prepared: bool) -> tuple[Path, RunOutputs | None, CheckpointManager]:
    """The run directory, rank 0's writer for it, and its checkpoints.

    Named and prepared once: by the launcher that started this worker (``prepared``: ``shoal train
    --nproc``, ``shoal.fit``; it names the directory before the first attempt so that a restarted
    group finds it), else here, on rank 0, shared with the others (every rank of a torchrun, srun or
    mpirun job runs the command itself)."""
    named = cfg.out or broadcast_object(default_out_dir(short_name(cfg.workload)) if ctx.is_main else None)
    out = Path(named).expanduser()
    outputs = RunOutputs(out if prepared else prepare_out_dir(out)) if ctx.is_main else None
    directory = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else out / "checkpoints"
    # FSDP's model and optimizer are sharded: every rank writes its shards (DCP). An async save is a
    # DCP save too, whatever the strategy.
    manager = CheckpointManager(
        directory,
        every=cfg.cadence,
        keep=cfg.keep,
        sharded=cfg.strategy == "fsdp",
        async_save=cfg.async_checkpoint,
    )
    return out, outputs, manager


def _load_data(cfg: TrainConfig, ctx: Context, workload: Workload) -> Any:
    """The workload's data (its train and test sets, transforms, loader options)."""
    with blame(workload, "load()", "fix the error in your workload's load() or Dataset at that line"):
        return workload.load(cfg, ctx.device, rank=ctx.rank)


def _build_model(cfg: TrainConfig, ctx: Context, workload: Workload, data: Any) -> tuple[nn.Module, bool]:
    """The workload's model, channels-last where that pays (the data's transforms follow), wrapped
    for the strategy (DDP or FSDP); and whether it went channels-last."""
    with blame(workload, "build_model()", "fix the error in your workload's build_model() at that line"):
        model = workload.build_model(cfg, data.num_classes)
    if not isinstance(model, nn.Module):
        raise ShoalError(
            f"{type(workload).__name__}.build_model() returned a {type(model).__name__}, not a torch.nn.Module",
            "return the model (an nn.Module) from build_model()",
        )
    fsdp = cfg.strategy == "fsdp"
    # FSDP2 shards contiguous parameters only: no channels-last weights under fsdp (refused by the
    # config when asked for).
    channels_last = cfg.channels_last if cfg.channels_last is not None else has_conv2d(model) and not fsdp
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        data.train_transform = in_channels_last(data.train_transform)
        data.test_transform = in_channels_last(data.test_transform)
    # Under FSDP, --amp bf16 is FSDP's mixed precision (bf16 compute, float32 reduce and shards):
    # its policy casts, so no autocast on top.
    model = ctx.wrap(model, strategy=cfg.strategy, **({"mixed_precision": cfg.amp} if fsdp else {}))
    return model, channels_last


def _loaders(cfg: TrainConfig, ctx: Context, data: Any) -> tuple[Any, Any]:
    """This rank's train loader (its shard, resumable) and the evaluation loader (``--eval-samples``
    cuts the test set first)."""
    if cfg.eval_samples is not None:
        data.test = _first(data.test, cfg.eval_samples)
    options = data.loader_options
    train_loader = ctx.loader(data.train, cfg.batch_size, transform=data.train_transform, **options)
    eval_batch = cfg.eval_batch_size or 4 * cfg.batch_size
    test_loader = ctx.eval_loader(data.test, eval_batch, transform=data.test_transform, **options)
    return train_loader, test_loader


def _first(data: Any, n: int) -> Any:
    """The first ``n`` samples of a workload's test set (tensors sliced, a Dataset as a Subset)."""
    if isinstance(data, tuple):
        return tuple(t[:n] for t in data)
    return data if n >= len(data) else torch.utils.data.Subset(data, range(n))


def _train_plan(cfg: TrainConfig, ctx: Context, batches_per_epoch: int) -> TrainPlan:
    return TrainPlan(
        world_size=ctx.world_size,
        batch_size=cfg.batch_size,
        grad_accum=cfg.grad_accum,
        global_batch_size=cfg.batch_size * ctx.world_size * cfg.grad_accum,
        steps_per_epoch=-(-batches_per_epoch // cfg.grad_accum),
        epochs=cfg.epochs,
        base_lr=cfg.lr,
        lr=scaled_lr(cfg.lr, cfg.lr_scaling, ctx.world_size),
    )


def _build_step(
    cfg: TrainConfig, ctx: Context, model: nn.Module, plan: TrainPlan, loss_fn: Any
) -> tuple[Step, LRSchedule, Any]:
    """The step (optimizer, AMP, the phases it tells the watchdog), the lr schedule and the
    gradient communication hook."""
    # A no-op without DDP (one process); PowerSGD starts after 10% of the run, as torch advises.
    start = powersgd_start(plan.steps_per_epoch * plan.epochs)
    comm_hook = register_comm_hook(model, cfg.comm_hook, rank=cfg.powersgd_rank, start_iter=start)
    # After wrapping: FSDP's parameters are DTensor shards, and the optimizer must hold those.
    optimizer = build_optimizer(cfg.optimizer, model.parameters(), plan.lr, cfg.weight_decay)
    schedule = LRSchedule(plan.lr, plan.epochs, cfg.warmup_epochs)
    amp = "off" if cfg.strategy == "fsdp" else cfg.amp
    step = Step(model, optimizer, amp, ctx.device, loss_fn=loss_fn, progress=ctx.progress())
    return step, schedule, comm_hook


def _checkpointed(
    ctx: Context, step: Step, train_loader: Any, data: Any, comm_hook: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a checkpoint holds for exact resume: the run's objects (model, optimizer, AMP scaler, the
    loader's position, the epoch's tally) and each rank's own (its augmentation generator;
    PowerSGD's error feedback and memories)."""
    state = {
        "model": step.model,
        "optimizer": step.optimizer,
        "scaler": step.scaler,
        "loader": train_loader,
        "tally": EpochTally(ctx.device),
    }
    per_rank = {"augment": GeneratorState(data.generator)} if data.generator is not None else {}
    per_rank["comm_hook"] = comm_hook
    return state, per_rank


def _eval_filler(cfg: TrainConfig, ctx: Context, data: Any) -> torch.Tensor | None:
    """FSDP: the input of a rank's extra evaluation forwards when it is short of test batches (they
    are collective): the first test sample. None otherwise."""
    if cfg.strategy != "fsdp":
        return None
    first = first_samples(data.test, 1, ctx.device)
    return (data.test_transform(first) if data.test_transform else first)[0]


def _announce(run: RunState, derived: dict[str, Any], launch_record: dict[str, Any] | None) -> None:
    """Rank 0's start lines, and config.json (the resolved config, what was derived, the machine)."""
    cfg, ctx, plan = run.cfg, run.ctx, run.plan
    started = derived.get("start_method")
    ctx.print(f"shoal train {cfg.workload}: {ctx.describe()}" + (f" | workers started by {started}" if started else ""))
    ctx.print(f"  {plan.describe()} | lr scaling {cfg.lr_scaling} | {ctx.threads} threads/process")
    if cfg.comm_hook != "none":
        ctx.print(f"  comm hook {cfg.comm_hook}: {run.per_rank['comm_hook'].description}")
    kind = ", sharded" if run.checkpoints.sharded else ""
    kind += ", written in the background" if run.checkpoints.async_save else ""
    ctx.print(f"  checkpoints {run.checkpoints.every} in {run.checkpoints.directory} (keep {cfg.keep}{kind})")
    if cfg.strategy == "fsdp":
        ctx.print(
            f"  model sharded by FSDP over {ctx.world_size} processes"
            + (" (bf16 compute)" if cfg.amp == "bf16" else "")
        )
    if run.resumed_from is not None:
        where = "training" if not run.epoch_trained else "evaluation"
        ctx.print(f"  resuming from {run.resumed_from}: epoch {run.epoch}, step {run.global_step} ({where})")
    if run.outputs:
        env = ctx.environment
        config = cfg.to_dict()
        config["out"] = str(run.out)
        if launch_record is not None:
            config["launch"] = launch_record
        config["extra"] = {
            **{k: v for k, v in derived.items() if v is not None},
            "environment": env.scheme,
            "world_size": ctx.world_size,
            "num_nodes": env.num_nodes,
            "device": str(ctx.device),
            "backend": ctx.backend,
            "global_batch_size": plan.global_batch_size,
            "steps_per_epoch": plan.steps_per_epoch,
            "scaled_lr": plan.lr,
            "shoal_version": shoal_version,
            "torch_version": torch.__version__,
        }
        run.outputs.write_config(config)
        run.reports.config(config)
        ctx.print(f"  output: {run.outputs.directory}")


def _finish_run(run: RunState, model: nn.Module, record: dict[str, Any]) -> TrainResult:
    """After the last epoch: a checkpoint still being written waits, rank 0 saves model.pt (unless
    the run was complete already), and every rank returns what it has."""
    ctx, out, outputs = run.ctx, run.out, run.outputs
    run.wait_for_checkpoint()
    model_path = None
    if not run.trained_now:
        ctx.print(f"shoal: the run in {out} is already complete ({run.plan.epochs} epochs): nothing to do")
    # On every rank: under FSDP gathering the whole model is collective (rank 0 gets it, the
    # others {}); under DDP it is the state dict's references, no copy.
    run.sync_buffers()
    run.progress.phase("checkpoint")
    weights = model_state_dict(model)
    if outputs:
        if run.trained_now or not outputs.finished:
            ctx.print(f"saved {outputs.save_model(weights)} and metrics in {outputs.directory}")
        model_path = outputs.model_path
    metrics = outputs.logged_epochs() if outputs else ([record] if record else [])
    return TrainResult(run_dir=out, metrics=metrics, model_path=model_path, config=run.cfg)
