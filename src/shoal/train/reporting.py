"""What a training run tells the experiment trackers (``--tracker wandb,tensorboard,mlflow``).

Every rank holds a :class:`Reports`; only global rank 0's tracker talks to a tracker (see
:mod:`shoal.tracking`). What is logged is the job's number, never one rank's: the train loss of
every ``--log-every`` steps is reduced across ranks (one all-reduce, weighted by samples) before
rank 0 logs it; the epoch records are already exact (metrics.jsonl's). The predictions table comes
from rank 0 alone, on the first ``--log-predictions`` test samples, with the unwrapped model (a DDP
forward on one rank would wait for the others).

With no tracker every method returns at once: the per-step path costs one attribute test.

Stragglers: when the launcher's watchdog watches the job (``$SHOAL_PROGRESS_DIR``), its latest
verdict (``verdict.json`` there, written atomically) is read by rank 0 once per epoch; the ranks it
names as stragglers go into the epoch's record (``"stragglers": [line, ...]`` in metrics.jsonl) and
their number to the trackers (``epoch/stragglers``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from shoal.context import Context
from shoal.distributed.fsdp import is_fsdp
from shoal.distributed.wrap import unwrap_model
from shoal.progress import ENV_DIR, read_straggler_lines
from shoal.tracking import create_tracker, reduce_metrics
from shoal.tracking.predictions import Predictions
from shoal.tracking.spec import parse_spec
from shoal.train.config import TrainConfig


class Reports:
    """The run's tracker and the train-loss window between two logs."""

    _stragglers_seen = False
    """Once a straggler was reported, later epochs log ``epoch/stragglers`` too (0 when gone)."""

    def __init__(self, cfg: TrainConfig, ctx: Context, out: Path) -> None:
        self.tracker = create_tracker(
            cfg.tracker,
            run_dir=out,
            project=cfg.project,
            run_name=cfg.run_name,
            rank=ctx.rank,
            mlflow_uri=cfg.mlflow_uri,
            max_predictions=max(1, cfg.log_predictions),
        )
        on = bool(parse_spec(cfg.tracker))
        self.every = cfg.log_every if on else 0
        self.predictions = cfg.log_predictions if on else 0
        self.device = ctx.device
        self.is_main = ctx.is_main
        self.progress = ctx.progress()
        """The rank's ProgressWriter: the window's all-reduce is a collective."""
        self._start_window()

    def _start_window(self, samples: int = 0) -> None:
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self.count = torch.zeros((), dtype=torch.float64, device=self.device)
        self.window_samples, self.window_started = samples, time.perf_counter()

    # -- the loop's calls ---------------------------------------------------------------------------

    def micro_batch(self, loss: torch.Tensor, size: int) -> None:
        """Add a micro-batch's mean loss to the window (no host sync)."""
        if self.every:
            self.loss_sum += loss.double() * size
            self.count += size

    def step(self, step: int, lr: float, samples: int) -> None:
        """After optimizer step ``step`` (``samples``: global samples of the epoch so far); every
        ``--log-every`` steps the window's loss, lr and throughput (collective: every rank)."""
        if not self.every or step % self.every:
            return
        count = self.count.item()
        self.progress.collective()
        stats = reduce_metrics({"loss": self.loss_sum.item() / max(count, 1.0)}, count=count)
        seconds = time.perf_counter() - self.window_started
        done = samples - self.window_samples
        metrics = {"train/loss": stats["loss"], "train/lr": lr}
        if seconds > 0 and done > 0:
            metrics["train/samples_per_s"] = done / seconds
        self.tracker.log(metrics, step=step)
        self._start_window(samples)

    def epoch_started(self) -> None:
        if self.every:
            self._start_window()

    def epoch(
        self, record: dict[str, Any], step: int, model: nn.Module, test: Any, transform: Any, workload: Any
    ) -> None:
        """The epoch's record, and (rank 0) the predictions table of the first test samples."""
        if not (self.every or self.predictions):
            return
        stragglers = record.get("stragglers")
        numbers = {key: value for key, value in record.items() if key != "stragglers"}
        if stragglers is not None or self._stragglers_seen:
            numbers["stragglers"] = len(stragglers or ())
        self.tracker.log_epoch(numbers, step=step)
        # An FSDP forward is collective: every rank runs the table's forward, rank 0 logs it.
        if self.predictions and (self.tracker.enabled or is_fsdp(unwrap_model(model))):
            table = self._predictions(model, test, transform, workload)
            if table is not None and self.tracker.enabled:
                self.tracker.log_predictions(table, step=step)

    def stragglers(self) -> list[str]:
        """Rank 0: the watchdog's straggler lines of its latest verdict (``[]`` without a watchdog,
        a verdict or a straggler); other ranks: ``[]``. One small file read, once per epoch."""
        if not self.is_main:
            return []
        directory = os.environ.get(ENV_DIR)
        if not directory:
            return []
        lines = read_straggler_lines(directory)
        if lines:
            self._stragglers_seen = True
        return lines

    def _predictions(self, model: nn.Module, test: Any, transform: Any, workload: Any) -> Predictions | None:
        inputs, targets = first_samples(test, self.predictions, self.device)
        net = unwrap_model(model)
        was_training = net.training
        net.eval()
        with torch.no_grad():
            batch = (inputs, targets) if transform is None else transform((inputs, targets))
            logits = net(batch[0])
        net.train(was_training)
        if logits.dim() != 2 or targets.dim() != 1 or targets.is_floating_point():
            return None  # not a classifier's logits and class indices: no table of guesses
        images = workload.display_images(inputs)
        if images.dim() < 3:
            return None  # not pictures (e.g. feature vectors): the table's image column needs them
        return Predictions.from_logits(
            logits,
            targets,
            images,
            ids=range(len(targets)),
            class_names=workload.class_names,
        )

    # -- configuration, resume, end -------------------------------------------------------------

    def config(self, config: dict[str, Any]) -> None:
        if self.tracker.names:
            self.tracker.log_config(config)

    def state_dict(self) -> dict[str, Any]:
        """The trackers' run ids and last step, for the checkpoint (rank 0 flushes first)."""
        return self.tracker.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        self.tracker.load_state_dict(state)

    def close(self, *, failed: bool) -> None:
        self.tracker.close(failed=failed)


def first_samples(test: Any, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` test samples as ``(inputs, targets)`` on ``device``: sliced from tensors, or
    collated from a map-style Dataset's items."""
    if isinstance(test, (tuple, list)):
        return test[0][:n], test[1][:n]
    from torch.utils.data import default_collate

    inputs, targets = default_collate([test[i] for i in range(min(n, len(test)))])[:2]
    return inputs.to(device), targets.to(device)
