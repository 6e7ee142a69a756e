"""Horovod's collectives that move data between ranks: allgather, broadcast, alltoall, barrier.

Same conventions as :mod:`.ops` (names and defaults of ``horovod/torch/mpi_ops.py``, every call
works with one process). The ranks agree first (:mod:`.agreement`: dtype, name, root_rank and the
shape but for the first dimension where ranks may differ), in one small collective that also
brings allgather every rank's first dimension: a mismatch is the same error on every rank, not a
hang or a garbled result. int16 travels as int32 (:mod:`.dtypes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from shoal.horovod import agreement, dtypes, state
from shoal.horovod.errors import HorovodUsageError
from shoal.horovod.ops import DifferentiableAllreduce, Handle, ReduceOp, check_ready

_MAX_DIMS = 16


# ---- allgather ------------------------------------------------------------------------------------


def start_gather(call: str, tensors: list[torch.Tensor], name: str | None) -> Handle:
    """Concatenate every rank's ``tensors[i]`` along dimension 0 (first dimensions may differ), each i.

    The ranks agree first (:mod:`.agreement`), which also tells each rank every first dimension;
    all_gather moves equal sizes, so each tensor is padded to the longest and trimmed after.
    """
    check_ready(f"{call}()")
    return gather_ragged(call, tensors, name)


def gather_ragged(call: str, tensors: list[torch.Tensor], name: str | None) -> Handle:
    """:func:`start_gather` without the check that no rank has joined (the DistributedOptimizer's
    sparse gradients, which a joined rank answers with empty ones)."""
    job = state.job(f"{call}()")
    problem = None
    for tensor in tensors:
        if tensor.dim() == 0 or tensor.dim() > _MAX_DIMS:
            problem = (
                f"a tensor with {tensor.dim()} dimensions cannot be gathered",
                f"pass a tensor with 1 to {_MAX_DIMS} dimensions (tensor.reshape(1) for a scalar)",
            )
    firsts = agreement.agree(call, tensors, name, ragged=True, problem=problem)
    if job.context.world_size == 1:
        copies = [tensor.detach().clone(memory_format=torch.contiguous_format) for tensor in tensors]
        return Handle(None, lambda: copies, name)
    works, gathered = [], []
    for index, tensor in enumerate(tensors):
        counts = [rank_firsts[index] for rank_firsts in firsts]
        padded = dtypes.to_wire(tensor.detach().contiguous())
        if padded.shape[0] != max(counts):
            padded = torch.cat([padded, padded.new_zeros((max(counts) - padded.shape[0], *padded.shape[1:]))])
        parts = [torch.empty_like(padded) for _ in counts]
        works.append(dist.all_gather(parts, padded, group=state.group_for(padded), async_op=True))
        gathered.append((parts, counts, tensor.dtype))

    def finish() -> list[torch.Tensor]:
        return [
            dtypes.from_wire(torch.cat([part[:count] for part, count in zip(parts, counts)]), dtype)
            for parts, counts, dtype in gathered
        ]

    return Handle(works, finish, name)


def allgather_async(
    tensor: torch.Tensor, name: str | None = None, process_set: Any = state.global_process_set
) -> Handle:
    """Start concatenating every rank's ``tensor`` along dimension 0 (first dimensions may differ)."""
    state.check_process_set(process_set, "allgather_async")
    return start_gather("allgather", [tensor], name).then(lambda gathered: gathered[0])


class _Allgather(torch.autograd.Function):
    """Differentiable allgather: the gradient is averaged across ranks, then this rank's rows kept."""

    @staticmethod
    def forward(ctx, tensor, name=None):  # type: ignore[override]
        out = allgather_async(tensor, name).wait()
        ctx.rows = tensor.shape[0]
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        reduced = DifferentiableAllreduce.apply(grad.contiguous(), ReduceOp.Average, 1.0, 1.0)
        rows = allgather_async(torch.tensor([ctx.rows], device=grad.device)).wait()
        offset = int(rows[: state.rank()].sum().item())
        return reduced.narrow(0, offset, ctx.rows), None


def allgather(tensor: torch.Tensor, name: str | None = None, process_set: Any = state.global_process_set):
    """Every rank's ``tensor`` concatenated along dimension 0, in rank order (a new tensor)."""
    check_ready("allgather()")
    state.check_process_set(process_set, "allgather")
    return _Allgather.apply(tensor, name)


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
    agreement.agree("broadcast", [tensor], name, {"root_rank": root_rank})
    if job.context.world_size == 1:
        return Handle(None, lambda: tensor, name)
    wire = dtypes.to_wire(tensor.contiguous())
    work = dist.broadcast(wire, src=root_rank, group=state.group_for(wire), async_op=True)

    def finish() -> torch.Tensor:
        if wire is not tensor:
            tensor.copy_(wire)
        return tensor

    return Handle(work, finish, name)


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
    def forward(ctx, tensor, root_rank, name=None):  # type: ignore[override]
        ctx.root_rank = root_rank
        return broadcast_async(tensor, root_rank, name).wait()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        reduced = DifferentiableAllreduce.apply(grad.contiguous(), ReduceOp.Average, 1.0, 1.0)
        if state.rank() != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None


def broadcast(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = state.global_process_set
) -> torch.Tensor:
    """root_rank's ``tensor`` on every rank, as a new tensor (the input is left alone)."""
    check_ready("broadcast()")
    state.check_process_set(process_set, "broadcast")
    check_root(root_rank, "broadcast()")
    return _Broadcast.apply(tensor, root_rank, name)


# ---- alltoall, barrier ----------------------------------------------------------------------------


def _even_splits(rows: int, world: int) -> list[int]:
    """``rows`` spread over the ranks, the first ``rows % world`` one larger (sent only when even)."""
    return [rows // world + (1 if r < rows % world else 0) for r in range(world)]


def _check_splits(splits: Any, rows: int, world: int) -> tuple[list[int], tuple[str, str] | None]:
    """The rows to send to each rank, and the problem with ``splits`` (message, hint) or None.

    Without ``splits`` the rows must split evenly, as Horovod requires ("splits not provided, but
    first dimension of tensor is not an even multiple of the number of workers").
    """
    if splits is None:
        if rows % world:
            return _even_splits(rows, world), (
                f"splits not given and the tensor's {rows} rows do not split evenly among {world} ranks",
                f"pass splits= (one row count per rank, adding up to {rows}), or a tensor whose first "
                f"dimension is a multiple of hvd.size() ({world})",
            )
        return _even_splits(rows, world), None
    values = [int(v) for v in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
    if len(values) != world or any(v < 0 for v in values) or sum(values) != rows:
        return values, (
            f"splits={values} do not divide the tensor's {rows} rows among {world} ranks",
            f"pass {world} non-negative counts that add up to tensor.shape[0] ({rows}), one per destination rank",
        )
    return values, None


def alltoall_async(
    tensor: torch.Tensor,
    splits: Sequence[int] | torch.Tensor | None = None,
    name: str | None = None,
    process_set: Any = state.global_process_set,
) -> Handle:
    """Start an alltoall; ``synchronize`` returns ``(output, received_splits)`` as Horovod's does."""
    job = check_ready("alltoall_async()")
    state.check_process_set(process_set, "alltoall_async")
    if tensor.dim() == 0:
        raise HorovodUsageError(
            "hvd.alltoall: a 0-d tensor has no rows to send", "pass a tensor with a first dimension"
        )
    world = job.context.world_size
    send, problem = _check_splits(splits, tensor.shape[0], world)
    agreement.agree("alltoall", [tensor], name, ragged=True, problem=problem)  # bad splits: every rank raises
    if world == 1:
        output = tensor.detach().clone(memory_format=torch.contiguous_format)
        return Handle(None, lambda: (output, torch.tensor(send, dtype=torch.int32)), name)
    incoming = torch.empty(world, dtype=torch.int64)
    dist.all_to_all_single(incoming, torch.tensor(send, dtype=torch.int64), group=state.object_group())
    received = [int(count) for count in incoming.tolist()]
    wire = dtypes.to_wire(tensor.detach().contiguous())
    output = wire.new_empty((sum(received), *tensor.shape[1:]))
    work = dist.all_to_all_single(
        output, wire, output_split_sizes=received, input_split_sizes=send, group=state.group_for(wire), async_op=True
    )
    return Handle(
        work, lambda: (dtypes.from_wire(output, tensor.dtype), torch.tensor(received, dtype=torch.int32)), name
    )


class _Alltoall(torch.autograd.Function):
    """Differentiable alltoall: the gradient's rows go back where they came from (as Horovod's)."""

    @staticmethod
    def forward(ctx, tensor, splits, name):  # type: ignore[override]
        output, received = alltoall_async(tensor, splits, name).wait()
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad, _received_grad):  # type: ignore[override]
        back, _ = alltoall_async(grad.contiguous(), ctx.received).wait()
        return back, None, None


def alltoall(
    tensor: torch.Tensor,
    splits: Sequence[int] | torch.Tensor | None = None,
    name: str | None = None,
    process_set: Any = state.global_process_set,
):
    """Send ``splits[j]`` rows of ``tensor`` to rank j, receive the rows every rank sends here.

    Returns the received rows (in rank order), and, when ``splits`` was given, also how many rows
    came from each rank (an int32 tensor), as Horovod does. Differentiable, as Horovod's.
    """
    check_ready("alltoall()")
    state.check_process_set(process_set, "alltoall")
    output, received = _Alltoall.apply(tensor, splits, name)
    return output if splits is None else (output, received)


def barrier(process_set: Any = state.global_process_set) -> None:
    """Wait until every rank has reached this call.

    The wait is the agreement round itself (an all_gather waits for every rank), so a rank that
    called another collective meanwhile gets the mismatch error instead of a hang, and a rank
    inside ``hvd.join()`` answers it.
    """
    check_ready("barrier()")
    state.check_process_set(process_set, "barrier")
    agreement.agree("barrier", [])
