"""What a ready workload provides: its data as in-memory tensors, its model and its defaults."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch
from torch import nn

from shoal.errors import ShoalError


class WorkloadSettings(Protocol):
    """What a workload reads of the run's configuration (``shoal.train.config.TrainConfig`` has it).

    A protocol rather than the config class itself: workloads sit below the trainer, and a test or
    a user can hand a workload any object with these attributes.
    """

    workload: str
    data: str | None
    download: bool
    seed: int
    arch: str
    image_size: int
    samples: int | None


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
    generator: torch.Generator | None = None
    """The RNG the transforms draw from (e.g. augmentation), checkpointed per rank."""


class Workload:
    """One ready workload. Subclasses set the class attributes and implement the three methods."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    defaults: ClassVar[dict[str, Any]] = {}
    """Defaults for the training config's fields left as None: epochs, batch_size, lr, optimizer, weight_decay."""

    def prepare(self, cfg: WorkloadSettings) -> None:
        """Check (or download) the data in the launching process, before any worker starts."""

    def load(self, cfg: WorkloadSettings, device: torch.device, rank: int = 0) -> WorkloadData:  # pragma: no cover
        """The datasets, already preprocessed, as tensors (on ``device`` when they fit there)."""
        raise NotImplementedError

    def build_model(self, cfg: WorkloadSettings, num_classes: int) -> nn.Module:  # pragma: no cover
        raise NotImplementedError

    class_names: ClassVar[tuple[str, ...] | None] = None
    """Names of the classes, for tables of predictions (default: their indices)."""

    def display_images(self, inputs: torch.Tensor) -> torch.Tensor:
        """Test inputs as pictures (``N x H x W`` or ``N x C x H x W``) for a predictions table."""
        return inputs


def data_root(cfg: WorkloadSettings, layout: str) -> Path:
    """``--data`` as a path; a missing ``--data`` is an error saying which ``layout`` is expected."""
    if not cfg.data:
        raise ShoalError(
            f"the {cfg.workload} workload needs a data directory",
            f"pass --data DIR (with {layout}), and --download to fetch it there",
        )
    return Path(cfg.data).expanduser()


def check_or_download(
    cfg: WorkloadSettings, *, title: str, where: Path, missing: list[str], download: Callable[[], None], put_hint: str
) -> None:
    """Nothing missing: done. Missing and ``--download``: run ``download`` (errors explained).
    Missing otherwise: an error naming the missing files, ``put_hint`` and ``--download``."""
    if not missing:
        return
    if cfg.download:
        try:
            download()
        except Exception as err:  # network errors come in many types
            raise ShoalError(
                f"downloading {title} into {cfg.data} failed: {str(err).splitlines()[0]}",
                f"check the network, or {put_hint} and drop --download",
            ) from None
        return
    raise ShoalError(
        f"{title} not found in {where}: missing {', '.join(missing)}",
        f"{put_hint} and pass --data DIR, or add --download to fetch it",
    )
