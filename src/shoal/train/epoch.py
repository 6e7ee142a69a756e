"""One epoch of ``shoal train``'s loop (:mod:`shoal.train.trainer`): this rank's pass over its shard
(the steps, checkpoints on a step cadence, a preemption agreed by every rank), then the evaluation
and the epoch's record (metrics.jsonl and the console line). Where the run stands, and its saves,
are :class:`~shoal.train.run_state.RunState`'s."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from shoal.context import Context
from shoal.distributed.collectives import all_reduce_sum
from shoal.evaluation import evaluate
from shoal.preemption import Preempted, PreemptionWatch
from shoal.train.config import TrainConfig
from shoal.train.optim import LRSchedule
from shoal.train.run_state import RunState
from shoal.train.step import Step, StepTimer
from shoal.workloads.base import Workload


def train_epoch(run: RunState, step: Step, loader: Any, schedule: LRSchedule, preemption: PreemptionWatch) -> None:
    """This rank's pass over the rest of the epoch's shard, checkpointing on the cadence."""
    cfg, tally, reports = run.cfg, run.tally, run.reports
    step.model.train()
    sampler = loader.sampler
    num_samples = sampler.num_samples
    batches = len(loader)
    accum = cfg.grad_accum
    bar = _progress_bar(cfg, run.ctx, batches, run.epoch, run.plan.epochs)
    postfix_every = max(1, batches // 10)
    remaining = sampler.num_remaining if not sampler.epoch_done else num_samples
    position = num_samples - remaining  # global samples of this epoch before the next step
    step_cadence = run.checkpoints.every.unit == "step"
    reports.epoch_started()
    timer = StepTimer(run.progress, tally)
    timer.start(run.global_step)
    for index, (inputs, targets) in enumerate(loader):
        timer.fetched()
        window_start = index - index % accum
        window = min(accum, batches - window_start)  # the last window of an epoch may be shorter
        last = index == window_start + window - 1
        loss = step.micro_batch(inputs, targets, weight=1.0 / window, sync=last)
        size = targets.shape[0]
        tally.loss_sum += loss.double() * size
        tally.count += size
        reports.micro_batch(loss, size)
        if bar is not None:
            bar.update(1)
            if index % postfix_every == 0:  # the only host sync of the step, and only now and then
                bar.set_postfix(loss=f"{loss.item():.4f}")
        if not last:
            timer.micro_batch_done(size)
            continue
        schedule.apply(step.optimizer, run.epoch - 1 + position / num_samples)
        step.apply()
        run.global_step += 1
        tally.samples += remaining - sampler.num_remaining
        remaining = sampler.num_remaining
        position = num_samples - remaining
        run.epoch_trained = sampler.epoch_done and index == batches - 1
        timer.computed(size, step.waited_s)  # the backward's wait for the other ranks is no compute
        reports.step(run.global_step, step.optimizer.param_groups[0]["lr"], tally.samples)
        signum = timer.step_done(preemption)  # every rank agrees on a preemption
        if signum or step_cadence:
            timer.to_tally()
            path = run.save(epoch_end=False, force=bool(signum))
            if signum:
                run.wait_for_checkpoint()  # an async save must be on disk before the process exits
                raise _preempted(run, signum, path)
        timer.fetching(run.global_step)
    if bar is not None:
        bar.close()
    timer.stop()
    run.epoch_trained = True
    run.trained_now = True


def _progress_bar(cfg: TrainConfig, ctx: Context, total: int, epoch: int, epochs: int):
    """Rank 0's tqdm bar over the epoch's batches (``--progress``; by default when stderr is a
    terminal), or None. Not the watchdog's progress record (``run.progress``)."""
    show = cfg.progress if cfg.progress is not None else sys.stderr.isatty()
    if not (ctx.is_main and show):
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=f"epoch {epoch}/{epochs}", leave=False, dynamic_ncols=True, file=sys.stderr)


def _preempted(run: RunState, signum: int, path: Path | None) -> Preempted:
    name = signal.Signals(signum).name
    where = f" to {path}" if path else ""
    return Preempted(
        f"preempted by {name} in epoch {run.epoch} after step {run.global_step}; checkpoint saved{where}",
        f"run the same command again to resume (--resume auto finds the newest checkpoint in {run.out})",
        exit_code=128 + signum,
    )


def finish_epoch(run: RunState, model: nn.Module, test_loader: Any, step: Step) -> dict[str, Any]:
    """Evaluate and log the epoch's metrics (metrics.jsonl, the console); the loop then reports them
    to the trackers and checkpoints on the epoch cadence."""
    ctx, tally, progress = run.ctx, run.tally, run.progress
    started = time.perf_counter()
    run.sync_buffers()
    progress.phase("evaluation")
    workload = run.workload
    # The default metric (accuracy) has known names: no broadcast of them per evaluation.
    own_metrics = workload is not None and type(workload).metrics is not Workload.metrics
    scores = evaluate(
        model,
        test_loader,
        loss_fn=run.loss_fn,
        metrics_fn=workload.metrics if own_metrics else None,
        autocast=step.autocast,
        filler=run.eval_filler,
    )
    metrics = {f"test_{name}": value for name, value in scores.items() if name not in ("loss", "samples")}
    if workload is not None:
        derived = workload.derived_metrics({k: v for k, v in scores.items() if k != "samples"})
        metrics.update({f"test_{name}": float(value) for name, value in derived.items()})
    progress.collective()
    loss_total, count = all_reduce_sum(torch.stack([tally.loss_sum, tally.count])).tolist()
    progress.phase("evaluation")
    train_s = tally.train_s
    record = {
        "epoch": run.epoch,
        "train_loss": loss_total / max(count, 1),
        "test_loss": scores["loss"],
        **metrics,
        "test_samples": int(scores["samples"]),
        "samples_per_s": tally.samples / train_s if train_s > 0 else float("nan"),
        "epoch_s": train_s + time.perf_counter() - started,
        "samples_seen": tally.samples,
        "world_size": ctx.world_size,
        "global_batch_size": run.plan.global_batch_size,
        "lr": step.optimizer.param_groups[0]["lr"],
    }
    stragglers = run.reports.stragglers()
    if stragglers:
        record["stragglers"] = stragglers
    if run.outputs:
        run.outputs.log_epoch(record)
    shown = "".join(f"  {name.replace('accuracy', 'acc')} {value:.4f}" for name, value in metrics.items())
    ctx.print(
        f"epoch {run.epoch}/{run.plan.epochs}  train_loss {record['train_loss']:.4f}  test_loss {scores['loss']:.4f}"
        f"{shown}  {record['samples_per_s']:,.0f} samples/s  {record['epoch_s']:.2f} s"
    )
    return record
