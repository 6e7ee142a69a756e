"""Packing many tensors into few flat buffers, so that one collective moves a whole bucket.

Each collective has a fixed cost (a round trip, a kernel launch); a model has hundreds of small
tensors. Like DDP's reducer, tensors are grouped in their given order into buckets of one device
and dtype, capped in bytes; the first bucket is kept small so that its all-reduce can start while
backward is still computing the rest.

Caps: DDP's defaults (1 MiB first bucket, 25 MiB others), or ``HOROVOD_FUSION_THRESHOLD`` (bytes)
for the later buckets when a Horovod user has tuned it; 0 there means one tensor per bucket, as
Horovod's "no fusion".
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from shoal.horovod.errors import HorovodUsageError

FIRST_BUCKET_BYTES = 1024 * 1024
"""torch.distributed's ``_DEFAULT_FIRST_BUCKET_BYTES``: the first all-reduce starts early."""
BUCKET_BYTES = 25 * 1024 * 1024
"""DDP's ``bucket_cap_mb=25``."""


def bucket_caps() -> tuple[int, int]:
    """(first bucket, other buckets) caps in bytes, honouring ``HOROVOD_FUSION_THRESHOLD``."""
    raw = os.environ.get("HOROVOD_FUSION_THRESHOLD")
    if raw is None:
        return FIRST_BUCKET_BYTES, BUCKET_BYTES
    try:
        cap = int(raw)
    except ValueError:
        raise HorovodUsageError(
            f"HOROVOD_FUSION_THRESHOLD={raw!r} is not a number of bytes",
            "set it to bytes per bucket (e.g. 67108864), or unset it for DDP's 25 MiB buckets",
        ) from None
    if cap < 0:
        raise HorovodUsageError(f"HOROVOD_FUSION_THRESHOLD={raw!r} is negative", "set it to 0 or more bytes")
    return min(cap, FIRST_BUCKET_BYTES), cap


def plan_buckets(tensors: Sequence[torch.Tensor], first_cap: int, cap: int) -> list[list[int]]:
    """Indices of ``tensors`` grouped into buckets, in order of each bucket's first tensor.

    A bucket holds tensors of one device and dtype, consecutive in ``tensors`` among those of its
    kind, and closes once it holds ``cap`` bytes (``first_cap`` for the first bucket closed). A
    tensor larger than the cap gets a bucket of its own.
    """
    closed: list[list[int]] = []
    open_by_kind: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    bytes_by_kind: dict[tuple[torch.device, torch.dtype], int] = {}
    for index, tensor in enumerate(tensors):
        kind = (tensor.device, tensor.dtype)
        current = open_by_kind.setdefault(kind, [])
        current.append(index)
        bytes_by_kind[kind] = bytes_by_kind.get(kind, 0) + tensor.numel() * tensor.element_size()
        if bytes_by_kind[kind] >= (first_cap if not closed else cap):
            closed.append(current)
            open_by_kind[kind] = []
            bytes_by_kind[kind] = 0
    closed.extend(group for group in open_by_kind.values() if group)
    return sorted(closed, key=lambda group: group[0])


def views(flat: torch.Tensor, shapes_of: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Consecutive slices of the 1-D ``flat``, each shaped like the matching tensor of ``shapes_of``."""
    out, offset = [], 0
    for tensor in shapes_of:
        count = tensor.numel()
        out.append(flat[offset : offset + count].view(tensor.shape))
        offset += count
    return out


def copy_all(targets: Sequence[torch.Tensor], sources: Sequence[torch.Tensor]) -> None:
    """``target.copy_(source)`` for each pair, in one call where torch offers it."""
    if _FOREACH_COPY is not None and targets:
        _FOREACH_COPY(list(targets), list(sources))
    else:
        for target, source in zip(targets, sources):
            target.copy_(source)


# torch's multi-tensor copy (the one its optimizers use): one dispatch instead of one per tensor.
_FOREACH_COPY = getattr(torch, "_foreach_copy_", None)


def pack(tensors: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy ``tensors`` one after another into the 1-D ``flat`` (which may be longer)."""
    copy_all(views(flat, tensors), tensors)


def unpack(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copy consecutive slices of ``flat`` back into ``tensors`` (the reverse of :func:`pack`)."""
    copy_all(tensors, views(flat, tensors))


def total_numel(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() for t in tensors)
