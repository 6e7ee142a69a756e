"""What a ready workload provides: its data as in-memory tensors, its model and its defaults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch
from torch import nn

from shoal.train.config import TrainConfig

BatchTransform = Callable[[tuple[torch.Tensor, ...]], tuple[torch.Tensor, ...]]


@dataclass
class WorkloadData:
    """Train and test sets as tensors (inputs, targets), plus optional per-batch transforms.

    Transforms run on whole batches, on the training device, after the loader has gathered them;
    they keep the data path free of per-sample Python work.
    """

    train: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]
    num_classes: int
    train_transform: BatchTransform | None = None
    test_transform: BatchTransform | None = None


class Workload:
    """One ready workload. Subclasses set the class attributes and implement the three methods."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    defaults: ClassVar[dict[str, Any]] = {}
    """Defaults for TrainConfig fields left as None: epochs, batch_size, lr, optimizer, weight_decay."""

    def prepare(self, cfg: TrainConfig) -> None:
        """Check (or download) the data in the launching process, before any worker starts."""

    def load(self, cfg: TrainConfig, device: torch.device, rank: int = 0) -> WorkloadData:  # pragma: no cover
        """The datasets, already preprocessed, as tensors (on ``device`` when they fit there)."""
        raise NotImplementedError

    def build_model(self, cfg: TrainConfig, num_classes: int) -> nn.Module:  # pragma: no cover
        raise NotImplementedError
