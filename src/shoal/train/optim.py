"""Optimizer, learning-rate scaling by world size, and the warm-up + cosine schedule."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch


def scaled_lr(base_lr: float, scaling: str, world_size: int) -> float:
    """The learning rate after scaling by the number of processes.

    ``linear`` multiplies by the world size (Goyal et al., 2017; what Horovod's examples do),
    ``sqrt`` by its square root (often better for adaptive optimizers), ``none`` keeps it.
    """
    if scaling == "linear":
        return base_lr * world_size
    if scaling == "sqrt":
        return base_lr * math.sqrt(world_size)
    return base_lr


def build_optimizer(
    name: str, params: Iterable[torch.nn.Parameter], lr: float, weight_decay: float
) -> torch.optim.Optimizer:
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=0.9, nesterov=True, weight_decay=weight_decay)


@dataclass(frozen=True)
class LRSchedule:
    """Linear warm-up over ``warmup_epochs``, then cosine decay to zero at ``epochs``.

    A function of training *progress* (epochs done, fractional), not of the step count: a run
    resumed with another world size (so another number of steps per epoch) continues on the same
    curve, and it has no state to checkpoint.
    """

    peak_lr: float
    epochs: int
    warmup_epochs: float = 0.0

    def at(self, progress: float) -> float:
        """The learning rate after ``progress`` epochs of training."""
        if progress < self.warmup_epochs:
            return self.peak_lr * (progress + 1e-3) / (self.warmup_epochs + 1e-3)
        span = max(self.epochs - self.warmup_epochs, 1e-9)
        fraction = min(1.0, (progress - self.warmup_epochs) / span)
        return self.peak_lr * 0.5 * (1.0 + math.cos(math.pi * fraction))

    def apply(self, optimizer: torch.optim.Optimizer, progress: float) -> float:
        lr = self.at(progress)
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr
