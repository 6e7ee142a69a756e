"""A ``torch.utils.data.DataLoader`` made resumable and self-reshuffling by a :class:`ShardedSampler`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from ._base import ResumableLoader, Transform, as_device, move_to
from .sampler import ShardedSampler


class ShardedDataLoader(ResumableLoader):
    """Per-rank batches of any map-style dataset, through one long-lived ``DataLoader``.

    Args:
        dataset: a map-style dataset (``__getitem__`` and ``__len__``).
        batch_size: samples per batch on this rank.
        sampler: the :class:`ShardedSampler` for this rank.
        device: move each batch (tensors inside tuples, lists and dicts too) there.
        non_blocking: asynchronous copies to CUDA (only useful with pinned memory).
        transform: called on each collated batch after the move; what it returns is yielded.
        num_workers, pin_memory, collate_fn, **dataloader_kwargs: as for ``DataLoader``;
            ``pin_memory=None`` pins when ``device`` is CUDA.

    Batches are the same as :class:`~shoal.data.loader.TensorBatchLoader` would give for the same
    sampler. The ``DataLoader`` draws a fresh sampler iterator for every pass (also with
    ``persistent_workers``), and the sampler snapshots its indices from the position at that
    moment, so worker prefetching never moves the position: only batches handed out do.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        sampler: ShardedSampler,
        *,
        device: torch.device | str | None = None,
        non_blocking: bool = True,
        transform: Transform | None = None,
        num_workers: int = 0,
        pin_memory: bool | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        **dataloader_kwargs: Any,
    ) -> None:
        super().__init__(batch_size, sampler)
        if len(dataset) != sampler.num_samples:  # type: ignore[arg-type]
            raise ValueError(
                f"the sampler covers {sampler.num_samples} samples but the dataset holds {len(dataset)}"  # type: ignore[arg-type]
            )
        self.device = as_device(device)
        on_cuda = self.device is not None and self.device.type == "cuda"
        pin = (on_cuda and torch.cuda.is_available()) if pin_memory is None else pin_memory
        self.non_blocking = non_blocking and on_cuda and pin
        self.transform = transform
        # Our own generator for the workers' base seed: by default DataLoader draws it from the
        # global RNG, which would shift the user's model/dropout random stream once per epoch.
        # It is reseeded per (seed, rank, epoch) at each pass, so augmentations replay on resume.
        self._own_generator = "generator" not in dataloader_kwargs
        if self._own_generator:
            dataloader_kwargs["generator"] = torch.Generator()
        self.dataloader = DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            drop_last=False,  # the sampler already dropped (it knows the global batch)
            num_workers=num_workers,
            pin_memory=pin,
            collate_fn=collate_fn,
            **dataloader_kwargs,
        )

    def _batches(self) -> Iterator[Any]:
        sampler = self._sampler
        if self._own_generator:
            self.dataloader.generator.manual_seed(  # type: ignore[union-attr]
                ((sampler.seed * 1_000_003 + sampler.epoch) * 65_537 + sampler.rank) % 2**63
            )
        step = self._step_samples()
        for batch in self.dataloader:
            if self.device is not None:
                batch = move_to(batch, self.device, self.non_blocking)
            if self.transform is not None:
                batch = self.transform(batch)
            sampler.advance(step)
            yield batch
        self._finish_pass()
