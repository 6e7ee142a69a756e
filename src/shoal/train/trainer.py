"""The training loop of ``shoal train``: reads like a table of contents; each part owns its timing."""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

import shoal
from shoal.dist.collectives import all_reduce_sum, broadcast_object
from shoal.dist.context import Context
from shoal.dist.wrap import model_state_dict
from shoal.errors import ShoalError
from shoal.train.config import TrainConfig
from shoal.train.evaluate import evaluate
from shoal.train.optim import build_optimizer, scaled_lr, warmup_cosine
from shoal.train.outputs import RunOutputs, default_out_dir, prepare_out_dir
from shoal.workloads import get_workload


@dataclass(frozen=True)
class Plan:
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


def resolve_defaults(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with every None replaced by the workload's default."""
    workload = get_workload(cfg.workload)
    defaults = workload.defaults
    changes = {
        name: defaults[name]
        for name in ("epochs", "batch_size", "lr", "optimizer", "weight_decay")
        if getattr(cfg, name) is None and name in defaults
    }
    if cfg.warmup_epochs == 0 and "warmup_epochs" in defaults:
        changes["warmup_epochs"] = defaults["warmup_epochs"]
    return cfg.replace(**changes) if changes else cfg


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Run one training job in this process (one rank of it); return the last epoch's metrics."""
    cfg = resolve_defaults(cfg)
    workload = get_workload(cfg.workload)
    ctx = shoal.init(device=cfg.device, backend=cfg.backend, seed=cfg.seed)
    try:
        if cfg.amp == "fp16" and ctx.device.type != "cuda":
            raise ShoalError("--amp fp16 needs a CUDA device", "use --amp bf16 or --amp off on CPU")
        outputs = _outputs(cfg, ctx)
        data = workload.load(cfg, ctx.device, rank=ctx.rank)
        model = ctx.wrap(workload.build_model(cfg, data.num_classes))
        train_loader = ctx.loader(data.train, cfg.batch_size, transform=data.train_transform)
        test_loader = ctx.eval_loader(data.test, cfg.eval_batch_size or 4 * cfg.batch_size, transform=data.test_transform)
        plan = _plan(cfg, ctx, len(train_loader))
        optimizer = build_optimizer(cfg.optimizer, model.parameters(), plan.lr, cfg.weight_decay)
        schedule = warmup_cosine(optimizer, plan.steps_per_epoch * plan.epochs, round(cfg.warmup_epochs * plan.steps_per_epoch))
        step = Step(model, optimizer, schedule, cfg.amp, ctx.device)
        _announce(cfg, ctx, plan, outputs)
        record: dict[str, Any] = {}
        for epoch in range(1, plan.epochs + 1):
            started = time.perf_counter()
            train_loss, samples = _train_epoch(step, train_loader, cfg, epoch, plan, ctx, len(data.train[0]))
            train_s = time.perf_counter() - started
            scores = evaluate(model, test_loader, autocast=step.autocast)
            record = {
                "epoch": epoch,
                "train_loss": train_loss,
                "test_loss": scores["loss"],
                "test_accuracy": scores["accuracy"],
                "samples_per_s": samples / train_s if train_s > 0 else float("nan"),
                "epoch_s": time.perf_counter() - started,
                "samples_seen": samples,
                "world_size": ctx.world_size,
                "global_batch_size": plan.global_batch_size,
                "lr": optimizer.param_groups[0]["lr"],
            }
            if outputs:
                outputs.log_epoch(record)
            ctx.print(
                f"epoch {epoch}/{plan.epochs}  train_loss {train_loss:.4f}  test_loss {scores['loss']:.4f}  "
                f"test_acc {scores['accuracy']:.4f}  {record['samples_per_s']:,.0f} samples/s  {record['epoch_s']:.2f} s"
            )
        if outputs:
            path = outputs.save_model(model_state_dict(model))
            ctx.print(f"saved {path} and metrics in {outputs.directory}")
        return record
    finally:
        ctx.shutdown()


class Step:
    """One optimizer step over ``grad_accum`` micro-batches, with AMP and DDP's no_sync handled."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, schedule: Any, amp: str, device: torch.device) -> None:
        self.model, self.optimizer, self.schedule = model, optimizer, schedule
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)
        self.autocast: Callable[[], Any] | None = (
            (lambda: torch.autocast(device.type, dtype=dtype)) if dtype is not None else None
        )
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")
        self.loss_fn = F.cross_entropy

    def micro_batch(self, inputs: torch.Tensor, targets: torch.Tensor, *, weight: float, sync: bool) -> torch.Tensor:
        """Forward and backward one micro-batch; gradients are all-reduced only when ``sync``."""
        no_sync = getattr(self.model, "no_sync", None)
        with contextlib.nullcontext() if sync or no_sync is None else no_sync():
            with self.autocast() if self.autocast else contextlib.nullcontext():
                loss = self.loss_fn(self.model(inputs), targets)
            self.scaler.scale(loss * weight).backward()
        return loss.detach()

    def apply(self) -> None:
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.schedule.step()


def _train_epoch(
    step: Step, loader: Any, cfg: TrainConfig, epoch: int, plan: Plan, ctx: Context, epoch_size: int
) -> tuple[float, int]:
    """One pass over this rank's shard; returns (mean train loss over all ranks, global samples)."""
    step.model.train()
    batches = len(loader)
    accum = cfg.grad_accum
    loss_sum = torch.zeros((), dtype=torch.float64, device=ctx.device)
    count = torch.zeros((), dtype=torch.float64, device=ctx.device)
    bar = _progress(cfg, ctx, batches, epoch, plan.epochs)
    postfix_every = max(1, batches // 10)
    for index, (inputs, targets) in enumerate(loader):
        window_start = index - index % accum
        window = min(accum, batches - window_start)  # the last window of an epoch may be shorter
        last = index == window_start + window - 1
        loss = step.micro_batch(inputs, targets, weight=1.0 / window, sync=last)
        if last:
            step.apply()
        loss_sum += loss.double() * targets.shape[0]
        count += targets.shape[0]
        if bar is not None:
            bar.update(1)
            if index % postfix_every == 0:  # the only host sync of the step, and only now and then
                bar.set_postfix(loss=f"{loss.item():.4f}")
    if bar is not None:
        bar.close()
    loss_total, samples = all_reduce_sum(torch.stack([loss_sum, count])).tolist()
    # Padding (to give every rank the same number of steps) repeats a few samples; they are not
    # counted as seen.
    return loss_total / max(samples, 1), min(int(samples), epoch_size)


def _plan(cfg: TrainConfig, ctx: Context, batches_per_epoch: int) -> Plan:
    return Plan(
        world_size=ctx.world_size,
        batch_size=cfg.batch_size,
        grad_accum=cfg.grad_accum,
        global_batch_size=cfg.batch_size * ctx.world_size * cfg.grad_accum,
        steps_per_epoch=-(-batches_per_epoch // cfg.grad_accum),
        epochs=cfg.epochs,
        base_lr=cfg.lr,
        lr=scaled_lr(cfg.lr, cfg.lr_scaling, ctx.world_size),
    )


def _outputs(cfg: TrainConfig, ctx: Context) -> RunOutputs | None:
    """Rank 0's writer; the directory name is decided on rank 0 and shared so all ranks agree."""
    out = cfg.out
    if out is None:
        out = broadcast_object(default_out_dir(cfg.workload) if ctx.is_main else None)
        cfg.out = out
    if not ctx.is_main:
        return None
    return RunOutputs(prepare_out_dir(out))


def _announce(cfg: TrainConfig, ctx: Context, plan: Plan, outputs: RunOutputs | None) -> None:
    ctx.print(f"shoal train {cfg.workload}: {ctx.describe()}")
    ctx.print(f"  {plan.describe()} | lr scaling {cfg.lr_scaling} | {ctx.threads} threads/process")
    if outputs:
        env = ctx.environment
        config = cfg.to_dict()
        config["extra"] = {
            **cfg.extra,
            "environment": env.scheme,
            "world_size": ctx.world_size,
            "num_nodes": env.num_nodes,
            "device": str(ctx.device),
            "backend": ctx.backend,
            "global_batch_size": plan.global_batch_size,
            "steps_per_epoch": plan.steps_per_epoch,
            "scaled_lr": plan.lr,
            "shoal_version": shoal.__version__,
            "torch_version": torch.__version__,
        }
        outputs.write_config(config)
        ctx.print(f"  output: {outputs.directory}")


def _progress(cfg: TrainConfig, ctx: Context, total: int, epoch: int, epochs: int):
    show = cfg.progress if cfg.progress is not None else sys.stderr.isatty()
    if not (ctx.is_main and show):
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=f"epoch {epoch}/{epochs}", leave=False, dynamic_ncols=True, file=sys.stderr)
