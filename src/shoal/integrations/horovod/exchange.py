"""Horovod's collectives that move data between ranks: allgather, broadcast, alltoall, barrier.

Same conventions as :mod:`.ops` (names and defaults of ``horovod/torch/mpi_ops.py``, ``name``
accepted and ignored, every call works with one process). Shapes are exchanged first where ranks
may differ (allgather's first dimension, alltoall's splits), in one small collective that also
checks dtypes and the other dimensions: a mismatch is a HorovodUsageError on every rank, not a
hang or a garbled result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from shoal.integrations.horovod import state
from shoal.integrations.horovod.errors import HorovodUsageError
from shoal.integrations.horovod.ops import DifferentiableAllreduce, Handle, ReduceOp, check_ready

_MAX_DIMS = 16
_DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.complex64,
    torch.complex128,
)


# ---- allgather ------------------------------------------------------------------------------------


def _dtype_code(dtype: torch.dtype) -> int:
    return _DTYPES.index(dtype) if dtype in _DTYPES else len(_DTYPES)


def _gather_shapes(tensor: torch.Tensor, call: str) -> list[list[int]]:
    """Every rank's shape of ``tensor``; a HorovodUsageError on every rank when they cannot be joined."""
    if tensor.dim() == 0 or tensor.dim() > _MAX_DIMS:
        raise HorovodUsageError(
            f"hvd.{call}: a tensor with {tensor.dim()} dimensions cannot be gathered",
            f"pass a tensor with 1 to {_MAX_DIMS} dimensions (tensor.reshape(1) for a scalar)",
        )
    meta = torch.zeros(2 + _MAX_DIMS, dtype=torch.int64, device=tensor.device)
    meta[0], meta[1] = tensor.dim(), _dtype_code(tensor.dtype)
    meta[2 : 2 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
    everyone = [torch.empty_like(meta) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, meta, group=state.group_for(tensor))
    rows = [m.tolist() for m in everyone]
    mine = rows[dist.get_rank()]
    for other_rank, row in enumerate(rows):
        if row[:2] != mine[:2] or row[3 : 2 + row[0]] != mine[3 : 2 + mine[0]]:
            raise HorovodUsageError(
                f"hvd.{call}: rank {other_rank} has a tensor of shape {tuple(row[2 : 2 + row[0]])} "
                f"({_DTYPES[row[1]] if row[1] < len(_DTYPES) else 'other dtype'}) and rank {dist.get_rank()} "
                f"{tuple(mine[2 : 2 + mine[0]])} ({tensor.dtype})",
                "all ranks must pass tensors of one dtype whose shapes differ only in the first dimension",
            )
    return [row[2 : 2 + row[0]] for row in rows]


def allgather_async(
    tensor: torch.Tensor, name: str | None = None, process_set: Any = state.global_process_set
) -> Handle:
    """Start concatenating every rank's ``tensor`` along dimension 0 (first dimensions may differ)."""
    job = check_ready("allgather_async()")
    state.check_process_set(process_set, "allgather_async")
    tensor = tensor.detach().contiguous()
    if job.context.world_size == 1:
        out = tensor.clone()
        return Handle(None, lambda: out)
    firsts = [shape[0] for shape in _gather_shapes(tensor, "allgather()")]
    longest = max(firsts)
    padded = tensor
    if tensor.shape[0] != longest:  # all_gather moves equal sizes: pad to the longest, trim after
        padded = tensor.new_zeros((longest, *tensor.shape[1:]))
        padded[: tensor.shape[0]] = tensor
    parts = [torch.empty_like(padded) for _ in firsts]
    work = dist.all_gather(parts, padded, group=state.group_for(tensor), async_op=True)
    return Handle(work, lambda: torch.cat([part[:count] for part, count in zip(parts, firsts)]))


class _Allgather(torch.autograd.Function):
    """Differentiable allgather: the gradient is averaged across ranks, then this rank's rows kept."""

    @staticmethod
    def forward(ctx, tensor):  # type: ignore[override]
        out = allgather_async(tensor).wait()
        ctx.rows = tensor.shape[0]
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        reduced = DifferentiableAllreduce.apply(grad.contiguous(), ReduceOp.Average, 1.0, 1.0)
        rows = allgather_async(torch.tensor([ctx.rows], device=grad.device)).wait()
        offset = int(rows[: state.rank()].sum().item())
        return reduced.narrow(0, offset, ctx.rows)


def allgather(tensor: torch.Tensor, name: str | None = None, process_set: Any = state.global_process_set):
    """Every rank's ``tensor`` concatenated along dimension 0, in rank order (a new tensor)."""
    check_ready("allgather()")
    state.check_process_set(process_set, "allgather")
    return _Allgather.apply(tensor)


# ---- broadcast ------------------------------------------------------------------------------------


def check_root(root_rank: int, call: str) -> int:
    world = state.size()
    if not isinstance(root_rank, int) or not 0 <= root_rank < world:
        raise HorovodUsageError(
            f"hvd.{call}: root_rank={root_rank!r} is not a rank of this job (size {world})",
            f"pass a root_rank in 0..{world - 1} (usually 0)",
        )
    return root_rank


def broadcast_async_(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = state.global_process_set
) -> Handle:
    """Start overwriting ``tensor`` in place with root_rank's."""
    job = check_ready("broadcast_async_()")
    state.check_process_set(process_set, "broadcast_async_")
    check_root(root_rank, "broadcast_()")
    work = None
    if job.context.world_size > 1:
        work = dist.broadcast(tensor, src=root_rank, group=state.group_for(tensor), async_op=True)
    return Handle(work, lambda: tensor)


def broadcast_async(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = state.global_process_set
) -> Handle:
    """Start broadcasting root_rank's ``tensor`` into a new tensor."""
    return broadcast_async_(tensor.detach().clone(memory_format=torch.contiguous_format), root_rank, name, process_set)


def broadcast_(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = state.global_process_set
) -> torch.Tensor:
    """Overwrite ``tensor`` in place with root_rank's; returns it."""
    return broadcast_async_(tensor, root_rank, name, process_set).wait()


class _Broadcast(torch.autograd.Function):
    """Differentiable broadcast: the averaged gradient flows to the root only (as Horovod's)."""

    @staticmethod
    def forward(ctx, tensor, root_rank):  # type: ignore[override]
        ctx.root_rank = root_rank
        return broadcast_async(tensor, root_rank).wait()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        reduced = DifferentiableAllreduce.apply(grad.contiguous(), ReduceOp.Average, 1.0, 1.0)
        if state.rank() != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None


def broadcast(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = state.global_process_set
) -> torch.Tensor:
    """root_rank's ``tensor`` on every rank, as a new tensor (the input is left alone)."""
    check_ready("broadcast()")
    state.check_process_set(process_set, "broadcast")
    check_root(root_rank, "broadcast()")
    return _Broadcast.apply(tensor, root_rank)


# ---- alltoall, barrier ----------------------------------------------------------------------------


def _even_splits(rows: int, world: int) -> list[int]:
    """Horovod's default: ``rows`` spread over the ranks, the first ``rows % world`` one larger."""
    return [rows // world + (1 if r < rows % world else 0) for r in range(world)]


def _check_splits(splits: Any, rows: int, world: int) -> list[int]:
    if splits is None:
        return _even_splits(rows, world)
    values = [int(v) for v in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
    if len(values) != world or any(v < 0 for v in values) or sum(values) != rows:
        raise HorovodUsageError(
            f"hvd.alltoall: splits={values} do not divide the tensor's {rows} rows among {world} ranks",
            f"pass {world} non-negative counts that add up to tensor.shape[0] ({rows}), one per destination rank",
        )
    return values


def alltoall(
    tensor: torch.Tensor,
    splits: Sequence[int] | torch.Tensor | None = None,
    name: str | None = None,
    process_set: Any = state.global_process_set,
):
    """Send ``splits[j]`` rows of ``tensor`` to rank j, receive the rows every rank sends here.

    Returns the received rows (in rank order), and, when ``splits`` was given, also how many rows
    came from each rank (an int32 tensor), as Horovod does. Not differentiable here.
    """
    job = check_ready("alltoall()")
    state.check_process_set(process_set, "alltoall")
    world = job.context.world_size
    if tensor.dim() == 0:
        raise HorovodUsageError(
            "hvd.alltoall: a 0-d tensor has no rows to send", "pass a tensor with a first dimension"
        )
    rows = tensor.shape[0]
    send = _check_splits(splits, rows, world)
    if world == 1:
        output, received = tensor.detach().clone(), send
    else:
        row_numel = tensor[0].numel() if rows else int(torch.tensor(tensor.shape[1:]).prod().item())
        meta = torch.tensor([[count, row_numel, _dtype_code(tensor.dtype)] for count in send], device=tensor.device)
        incoming = torch.empty_like(meta)
        group = state.group_for(tensor)
        dist.all_to_all_single(incoming, meta, group=group)
        for source, (_, numel, code) in enumerate(incoming.tolist()):
            if (numel, code) != (row_numel, _dtype_code(tensor.dtype)):
                raise HorovodUsageError(
                    f"hvd.alltoall: rank {source} sends rows of {numel} elements (dtype #{code}), "
                    f"rank {state.rank()} rows of {row_numel} ({tensor.dtype})",
                    "all ranks must pass tensors of one dtype whose shapes differ only in the first dimension",
                )
        received = [int(count) for count in incoming[:, 0].tolist()]
        output = tensor.new_empty((sum(received), *tensor.shape[1:]))
        dist.all_to_all_single(
            output, tensor.detach().contiguous(), output_split_sizes=received, input_split_sizes=send, group=group
        )
    if splits is None:
        return output
    return output, torch.tensor(received, dtype=torch.int32)


def barrier(process_set: Any = state.global_process_set) -> None:
    """Wait until every rank has reached this call."""
    job = check_ready("barrier()")
    state.check_process_set(process_set, "barrier")
    if job.context.world_size > 1:
        dist.barrier(group=job.cpu_group)
