"""The pieces of a training step and of an epoch's state, each checkpointable where it must be.

- :class:`Step`: forward and backward over ``grad_accum`` micro-batches with AMP and DDP's
  ``no_sync`` (gradients all-reduced only on the last one), then the optimizer step;
- :class:`EpochTally`: the running sums of the current epoch (checkpointed, so an epoch resumed in
  the middle still reports its whole loss);
- :class:`GeneratorState`: a per-rank ``torch.Generator`` (augmentation) as a checkpointable object;
- channels-last helpers: move conv models and their 4-D batches to NHWC memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from shoal.distributed import collectives
from shoal.distributed.collectives import all_reduce_sum


class Step:
    """One optimizer step over ``grad_accum`` micro-batches, with AMP and DDP's no_sync handled."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        amp: str,
        device: torch.device,
        *,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
        progress: Any = None,
    ) -> None:
        """``amp``: the autocast dtype (off, bf16, fp16); "off" for an FSDP model in mixed precision,
        whose policy casts. ``progress``: the rank's :class:`~shoal.progress.ProgressWriter`, told
        the phase (forward, backward, optimizer); a disabled one costs an attribute test."""
        self.model, self.optimizer = model, optimizer
        self.progress = progress if progress is not None else _NO_PROGRESS
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)
        self.autocast: Callable[[], Any] | None = (
            (lambda: torch.autocast(device.type, dtype=dtype)) if dtype is not None else None
        )
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")
        self.loss_fn = loss_fn  # the mean over the micro-batch

    def micro_batch(self, inputs: torch.Tensor, targets: torch.Tensor, *, weight: float, sync: bool) -> torch.Tensor:
        """Forward and backward one micro-batch; gradients are all-reduced only when ``sync``."""
        no_sync = getattr(self.model, "no_sync", None)
        progress = self.progress
        with contextlib.nullcontext() if sync or no_sync is None else no_sync():
            progress.phase("forward")
            with self.autocast() if self.autocast else contextlib.nullcontext():
                loss = self.loss_fn(self.model(inputs), targets)
            progress.phase("backward")  # DDP's all-reduce and FSDP's reduce-scatter run in here
            self.scaler.scale(loss * weight).backward()
        return loss.detach()

    def apply(self) -> None:
        self.progress.phase("optimizer")
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)


class EpochTally:
    """The running sums of the current epoch (checkpointed, so a resumed epoch reports whole)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self.count = torch.zeros((), dtype=torch.float64, device=self.device)
        self.samples = 0  # global, real (non-padding) samples
        self.train_s = 0.0

    def consolidate(self) -> None:
        """Sum the per-rank loss sums onto rank 0 (collective), so rank 0's state is the total."""
        totals = all_reduce_sum(torch.stack([self.loss_sum, self.count]))
        keep = collectives.rank() == 0
        self.loss_sum, self.count = (
            (totals[0], totals[1]) if keep else (torch.zeros_like(totals[0]), torch.zeros_like(totals[1]))
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "loss_sum": self.loss_sum.cpu(),
            "count": self.count.cpu(),
            "samples": self.samples,
            "train_s": self.train_s,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        rank0 = collectives.rank() == 0
        self.loss_sum = (
            state["loss_sum"].to(self.device) if rank0 else torch.zeros((), dtype=torch.float64, device=self.device)
        )
        self.count = (
            state["count"].to(self.device) if rank0 else torch.zeros((), dtype=torch.float64, device=self.device)
        )
        self.samples, self.train_s = int(state["samples"]), float(state["train_s"])


class GeneratorState:
    """Adapts a torch.Generator to the state_dict protocol (per-rank augmentation RNG)."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def state_dict(self) -> dict[str, Any]:
        return {"state": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["state"])


class _NoProgress:
    def phase(self, name: str, step: int | None = None) -> None:
        pass


_NO_PROGRESS = _NoProgress()


def has_conv2d(model: nn.Module) -> bool:
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


def in_channels_last(transform: Callable | None) -> Callable:
    """``transform`` followed by moving 4-D inputs to channels-last memory (one copy per batch)."""

    def apply(batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        if transform is not None:
            batch = transform(batch)
        inputs, *rest = batch
        if inputs.dim() == 4:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        return (inputs, *rest)

    return apply
