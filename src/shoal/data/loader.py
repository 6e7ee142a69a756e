"""Loaders over a :class:`ShardedSampler`: the in-memory tensor fast path and :func:`make_loader`.

:class:`TensorBatchLoader` gathers each batch with one ``index_select`` per tensor instead of
collating sample by sample: on CPU that is ~3x faster than ``t[idx]`` (advanced indexing) and far
faster than a ``DataLoader`` over a ``TensorDataset``, which builds a batch from ``B`` single-sample
indexings. ``benchmarks/data.py`` (beside the package) measures it against raw slicing and
``index_select`` loops.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, TensorDataset

from shoal.errors import ShoalError

from ._base import ResumableLoader, Transform, as_device, check_batch_size
from .dataloader import ShardedDataLoader
from .sampler import ShardedSampler


class TensorBatchLoader(ResumableLoader):
    """Per-rank batches of in-memory tensors, gathered whole; resumable mid-epoch.

    Args:
        tensors: equal-length tensors indexed along dim 0 (e.g. ``(images, labels)``); they may
            live on CPU or already on the training device (then batches are gathered there).
        batch_size: samples per batch on this rank (the global batch is ``batch_size * world_size``).
        sampler: the :class:`ShardedSampler` that says which indices this rank gets.
        device: move each batch there. CPU tensors going to CUDA are gathered straight into pinned
            memory and copied with ``non_blocking``, so the copy overlaps the previous step.
        non_blocking: use asynchronous copies to CUDA (ignored elsewhere).
        transform: called on the tuple of batch tensors (after the move); what it returns is yielded.

    Yields tuples of tensors, one per input tensor. There is no per-sample Python work and no host
    sync per step: the epoch's index tensor is built once, and moved to the data's device once.
    """

    def __init__(
        self,
        tensors: Sequence[torch.Tensor],
        batch_size: int,
        sampler: ShardedSampler,
        *,
        device: torch.device | str | None = None,
        non_blocking: bool = True,
        transform: Transform | None = None,
    ) -> None:
        super().__init__(batch_size, sampler)
        self.tensors = tuple(check_tensors(tensors))
        if len(self.tensors[0]) != sampler.num_samples:
            raise ValueError(
                f"the sampler covers {sampler.num_samples} samples but the tensors hold {len(self.tensors[0])}"
            )
        self.device = as_device(device)
        self.non_blocking = non_blocking
        self.transform = transform

    def _batches(self) -> Iterator[Any]:
        idx = self._sampler.indices()
        tensors, target, bs = self.tensors, self.device, self.batch_size
        step = self._step_samples()
        devices = {t.device for t in tensors}
        if len(devices) == 1 and (target is None or target in devices):
            # The common case, kept lean: one index slice per batch, one index_select per tensor.
            # (The index moves to the data's device once per pass: one sync per epoch, not per step.)
            idx = idx.to(next(iter(devices)))
            advance, transform = self._sampler.advance, self.transform
            for start in range(0, len(idx), bs):
                i = idx[start : start + bs]
                batch = tuple([t.index_select(0, i) for t in tensors])
                if transform is not None:
                    batch = _as_batch(transform(batch))
                # Advance before handing the batch out: a state_dict taken while this batch is
                # being trained on resumes at the next one.
                advance(step)
                yield batch
        else:
            on_device = {d: idx.to(d) for d in devices}
            pin = target is not None and target.type == "cuda" and self.non_blocking and torch.cuda.is_available()
            for start in range(0, len(idx), bs):
                batch = tuple([self._gather(t, on_device[t.device][start : start + bs], target, pin) for t in tensors])
                if self.transform is not None:
                    batch = _as_batch(self.transform(batch))
                self._sampler.advance(step)
                yield batch
        self._finish_pass()

    def _gather(self, t: torch.Tensor, i: torch.Tensor, target: torch.device | None, pin: bool) -> torch.Tensor:
        if target is None or t.device == target:
            return t.index_select(0, i)
        if pin and t.device.type == "cpu":
            # Gather straight into pinned memory (one copy, not gather + pin); torch's caching host
            # allocator keeps the block alive until the asynchronous copy has finished.
            out = torch.empty((len(i), *t.shape[1:]), dtype=t.dtype, pin_memory=True)
            torch.index_select(t, 0, i, out=out)
            return out.to(target, non_blocking=True)
        return t.index_select(0, i).to(target, non_blocking=self.non_blocking and target.type == "cuda")


def _as_batch(batch: Any) -> Any:
    return tuple(batch) if isinstance(batch, list) else batch


def check_tensors(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``tensors`` as a list, checked to be one or more tensors of equal length."""
    tensors = list(tensors)
    if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise ShoalError(
            "a tensor dataset needs one or more tensors",
            "pass a TensorDataset or a tuple such as (inputs, targets)",
        )
    lengths = [len(t) if t.dim() > 0 else -1 for t in tensors]
    if len(set(lengths)) != 1 or lengths[0] < 0:
        raise ShoalError(
            f"the tensors of a tensor dataset must have the same length along dim 0, got {lengths}",
            "pass tensors indexed by sample along their first dimension",
        )
    return tensors


def _is_tensor_tuple(dataset: Any) -> bool:
    return isinstance(dataset, (tuple, list)) and len(dataset) > 0 and all(isinstance(t, torch.Tensor) for t in dataset)


def make_loader(
    dataset: Dataset | Sequence[torch.Tensor],
    batch_size: int,
    *,
    rank: int,
    world_size: int,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
    pad: bool = True,
    device: torch.device | str | None = None,
    num_workers: int = 0,
    pin_memory: bool | None = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    transform: Transform | None = None,
    **dataloader_kwargs: Any,
) -> TensorBatchLoader | ShardedDataLoader:
    """This rank's resumable, automatically reshuffling loader over ``dataset``.

    A ``TensorDataset`` or a tuple/list of equal-length tensors gets the :class:`TensorBatchLoader`
    fast path (``num_workers`` is then ignored: one vectorised gather per batch beats worker
    processes). Anything else, or a custom ``collate_fn``, gets a :class:`ShardedDataLoader` around
    ``torch.utils.data.DataLoader`` with the same sampler, so both paths yield the same samples in
    the same batches. ``dataloader_kwargs`` go to the ``DataLoader`` (``persistent_workers``,
    ``prefetch_factor``, ``worker_init_fn``, ...).

    ``pin_memory=None`` pins when ``device`` is CUDA.
    """
    check_batch_size(batch_size)
    for bad in ("sampler", "batch_sampler", "shuffle"):
        if bad in dataloader_kwargs:
            raise ShoalError(
                f"make_loader chooses the sampler itself; do not pass {bad}=",
                "use shuffle=, seed=, drop_last= and pad= of make_loader instead",
            )
    device = as_device(device)
    tensors: list[torch.Tensor] | None = None
    if isinstance(dataset, TensorDataset):
        tensors = check_tensors(dataset.tensors)
    elif _is_tensor_tuple(dataset):
        tensors = check_tensors(dataset)
        dataset = TensorDataset(*tensors)  # for the DataLoader path below (a custom collate_fn)
    elif isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        raise ShoalError(
            f"make_loader needs a map-style dataset (__getitem__ and __len__), got {type(dataset).__name__}",
            "shard an IterableDataset yourself, or wrap the data in a map-style Dataset",
        )
    num_samples = len(tensors[0]) if tensors is not None else len(dataset)  # type: ignore[arg-type]
    sampler = ShardedSampler(
        num_samples,
        rank=rank,
        world_size=world_size,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
        pad=pad,
        batch_size=batch_size,
    )
    if tensors is not None and collate_fn is None:
        return TensorBatchLoader(
            tensors,
            batch_size,
            sampler,
            device=device,
            non_blocking=True if pin_memory is None else pin_memory,
            transform=transform,
        )
    return ShardedDataLoader(
        dataset,  # type: ignore[arg-type]
        batch_size,
        sampler,
        device=device,
        transform=transform,
        num_workers=num_workers,
        pin_memory=pin_memory,
        collate_fn=collate_fn,
        **dataloader_kwargs,
    )
