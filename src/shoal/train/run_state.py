"""Where a ``shoal train`` run stands (epoch, step, whether the epoch's training part is done) and the
collective operations on that state: resume from the newest checkpoint, save when due, rank 0's
buffers to every rank, the next epoch. The loop itself is :mod:`shoal.train.trainer`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from shoal.checkpoint.manager import CheckpointManager, restore
from shoal.distributed.collectives import broadcast_object
from shoal.train.outputs import RunOutputs, refuse_existing_run
from shoal.train.step import EpochTally
from shoal.workloads.base import Workload


class RunState:
    """Where the run stands (epoch, step, whether the epoch's training part is done) and its I/O."""

    def __init__(self, cfg, ctx, plan, out, outputs, checkpoints, state, per_rank, reports) -> None:
        self.cfg, self.ctx, self.plan, self.out, self.reports = cfg, ctx, plan, out, reports
        self.outputs: RunOutputs | None = outputs
        self.checkpoints: CheckpointManager = checkpoints
        self.state, self.per_rank = state, per_rank
        self.epoch, self.global_step = 1, 0
        self.epoch_trained = False  # the epoch's training pass is done, its evaluation is not
        self.resumed_from: Path | None = None
        self.trained_now = False
        self.workload: Workload | None = None
        self.loss_fn: Any = None
        self.eval_filler: torch.Tensor | None = None
        """FSDP: the input of a rank's extra evaluation forwards (see :func:`shoal.evaluation.evaluate`)."""
        self.progress: Any = ctx.progress()
        self.buffers = [b for b in state["model"].buffers() if b.numel()]

    @property
    def tally(self) -> EpochTally:
        return self.state["tally"]

    def resume(self) -> None:
        cfg = self.cfg
        if cfg.resume == "never":
            checkpoint = None
        elif cfg.resume == "auto":
            checkpoint = self.checkpoints.load_latest()
        else:
            checkpoint = self.checkpoints.load(cfg.resume)
        started = broadcast_object(self.outputs.started if self.outputs else None)
        if checkpoint is None:
            if started and cfg.resume == "never":
                refuse_existing_run(self.out, "previous")
            if started and self.outputs:
                # Without a checkpoint to resume from, only a run that logged nothing yet (killed
                # in its first epoch) may be started over: anything else would lose results.
                if self.outputs.finished or self.outputs.logged_epochs():
                    refuse_existing_run(self.out, "finished" if self.outputs.finished else "previous")
                self.ctx.print(f"shoal: {self.out} has no checkpoint yet: starting from the beginning")
            return
        restore(checkpoint, self.state, per_rank=self.per_rank)
        extra = checkpoint.extra
        self.reports.load_state_dict(extra.get("tracker"))
        self.epoch, self.global_step = int(extra["epoch"]), checkpoint.step
        self.epoch_trained = bool(extra["epoch_trained"])
        if extra.get("epoch_logged"):
            self.epoch, self.epoch_trained = self.epoch + 1, False
            self.tally.reset()
        self.resumed_from = checkpoint.path
        if self.outputs:
            self.outputs.keep_epochs(self.epoch - 1)

    def save(self, *, epoch_end: bool, force: bool = False) -> Path | None:
        """Checkpoint now if the manager says it is due (collective: on every rank)."""
        final = epoch_end and self.epoch == self.plan.epochs
        if not self.checkpoints.due(
            epoch=self.epoch, step=self.global_step, epoch_end=epoch_end, final=final, force=force
        ):
            return None
        self.progress.collective()
        self.tally.consolidate()
        self.sync_buffers()
        self.progress.phase("checkpoint")
        extra = {"epoch": self.epoch, "epoch_trained": self.epoch_trained, "epoch_logged": epoch_end}
        if self.outputs is not None:
            extra["config"] = self.cfg.to_dict()
            extra["tracker"] = self.reports.state_dict()
        return self.checkpoints.save(
            epoch=self.epoch, step=self.global_step, objects=self.state, extra=extra, per_rank=self.per_rank
        )

    def sync_buffers(self) -> None:
        """Rank 0's buffers (BatchNorm's running statistics) to every rank, before evaluations and saves.

        Rank 0's are the model's (model.pt, the checkpoint), and every rank must evaluate with them
        for the evaluation to be the saved model's. Neither wrapper guarantees it: FSDP shards
        parameters, not buffers, and never broadcasts them, so each rank's statistics follow its own
        batches; DDP broadcasts rank 0's before each forward, which then updates them with the rank's
        own batch. Training is unaffected (it uses each batch's statistics)."""
        if self.ctx.world_size <= 1 or not self.buffers:
            return
        import torch.distributed as dist

        self.progress.collective()
        for buffer in self.buffers:
            dist.broadcast(buffer, src=0)

    def wait_for_checkpoint(self) -> None:
        """Until an async checkpoint in flight is written (every rank, before returning or exiting)."""
        self.checkpoints.wait()

    def next_epoch(self) -> None:
        self.epoch += 1
        self.epoch_trained = False
        self.tally.reset()
