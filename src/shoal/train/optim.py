"""Optimizer, learning-rate scaling by world size, and the warm-up + cosine schedule."""

from __future__ import annotations

import math
from typing import Iterable

import torch
from torch.optim.lr_scheduler import LambdaLR


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


def build_optimizer(name: str, params: Iterable[torch.nn.Parameter], lr: float, weight_decay: float) -> torch.optim.Optimizer:
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=0.9, nesterov=True, weight_decay=weight_decay)


def warmup_cosine(optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 0) -> LambdaLR:
    """Linear warm-up from ~0 over ``warmup_steps``, then cosine decay to zero at ``total_steps``."""
    total_steps = max(1, total_steps)
    warmup_steps = min(max(0, warmup_steps), total_steps - 1)

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return LambdaLR(optimizer, factor)
