"""The public workload contract: what ``shoal train``, ``shoal.fit`` and the Flyte task train.

A :class:`Workload` gives the datasets, the model, the loss, the metrics of exact evaluation and
the training defaults; shoal's loop does the rest (sharding, DDP, checkpoints and exact resume,
trackers, comm hooks, elastic restarts). The bundled workloads (digits, mnist, cifar10, synthetic)
are subclasses like a user's own; docs/WORKLOADS.md shows a complete example.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

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


Data = tuple[torch.Tensor, torch.Tensor] | Dataset
"""A dataset: ``(inputs, targets)`` tensors (the fast path: whole batches gathered at once) or any
map-style ``torch.utils.data.Dataset`` whose items are ``(input, target)`` (a torchvision dataset,
your own class)."""


@dataclass
class WorkloadData:
    """The train and test sets, plus optional per-batch transforms.

    ``train`` and ``test`` are each ``(inputs, targets)`` tensors or a map-style ``Dataset`` of
    ``(input, target)`` items. Transforms run on whole batches, on the training device, after the
    loader has gathered them: they keep the data path free of per-sample Python work (a Dataset
    may transform per sample in its ``__getitem__`` instead).
    """

    train: Data
    test: Data
    num_classes: int | None = None
    """Handed to :meth:`Workload.build_model` (``None`` when the workload has no classes)."""
    train_transform: BatchTransform | None = None
    test_transform: BatchTransform | None = None
    generator: torch.Generator | None = None
    """The RNG the transforms draw from (e.g. augmentation), checkpointed per rank."""
    loader_options: dict[str, Any] = field(default_factory=dict)
    """For a Dataset: ``torch.utils.data.DataLoader`` options of both loaders (``num_workers``,
    ``collate_fn``, ``persistent_workers``, ...); shoal chooses the sampler (tensors ignore them)."""


class Workload:
    """What shoal trains: subclass it, implement :meth:`load` and :meth:`build_model`, and
    override the rest where the defaults (cross-entropy, accuracy) do not fit.

    ``shoal train pkg.module:Name`` / ``path/to/file.py:Name`` calls the class with no arguments;
    ``shoal.fit(MyWorkload(...))`` takes an instance (it must pickle when workers are spawned,
    as on CUDA). Every rank calls :meth:`load` and :meth:`build_model` once per run.
    """

    name: ClassVar[str] = ""
    """A short name (bundled workloads: what ``shoal train NAME`` takes)."""
    summary: ClassVar[str] = ""
    defaults: ClassVar[dict[str, Any]] = {}
    """Defaults for the training config's fields left unset: epochs, batch_size, lr, optimizer
    (sgd or adamw), weight_decay, warmup_epochs. Flags and ``fit`` keywords override them."""

    def prepare(self, cfg: WorkloadSettings) -> None:
        """Check (or download) the data in the launching process, once, before any worker starts."""

    def load(self, cfg: WorkloadSettings, device: torch.device, rank: int = 0) -> WorkloadData:  # pragma: no cover
        """The train and test sets (``cfg.data`` is ``--data DIR``). Tensors may already sit on
        ``device``; a Dataset's batches are moved there. Every rank loads the whole set: shoal
        gives each rank its shard."""
        raise NotImplementedError

    def build_model(self, cfg: WorkloadSettings, num_classes: int | None) -> nn.Module:  # pragma: no cover
        """A fresh model (on the CPU; shoal moves it and wraps it in DDP). Seeded: every rank
        builds the same initial weights."""
        raise NotImplementedError

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The *mean* loss over a batch (default: cross-entropy of logits and class indices)."""
        return F.cross_entropy(outputs, targets)

    def metrics(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-batch *sums* for exact evaluation: shoal adds them over every batch of every rank
        and divides by the number of test samples; ``{"accuracy": ...}`` becomes ``test_accuracy``.
        Default: the number of correct arg-max predictions."""
        return {"accuracy": (outputs.argmax(dim=1) == targets).sum()}

    def derived_metrics(self, means: dict[str, float]) -> dict[str, float]:
        """Values computed from the epoch's exact test means (``loss`` and each of :meth:`metrics`),
        logged beside them as ``test_<name>``: what cannot be summed per batch, such as a
        perplexity, ``exp(loss)``. Default: none."""
        return {}

    class_names: ClassVar[tuple[str, ...] | None] = None
    """Names of the classes, for tables of predictions (default: their indices)."""

    def display_images(self, inputs: torch.Tensor) -> torch.Tensor:
        """Test inputs as pictures (``N x H x W`` or ``N x C x H x W``) for the trackers' table of
        predictions (made when the outputs are ``N x classes`` logits and this gives pictures)."""
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
