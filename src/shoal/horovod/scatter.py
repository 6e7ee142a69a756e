"""Horovod's reducescatter and grouped_reducescatter: reduce across ranks, each rank keeps its rows.

Names, arguments and defaults follow ``horovod/torch/mpi_ops.py`` (Horovod 0.28; ``op`` defaults
to Average there, unlike allreduce's ``None``). Rank r keeps rows of dimension 0 as Horovod splits
them (``ReducescatterOp::ComputeOutputShapeForRank`` in ``horovod/common/ops/collective_operations.cc``):
``rows // size`` each, the first ``rows % size`` ranks one more.

How: the whole tensor is all-reduced (:func:`~.ops.start_reduce`, so the same checks, dtypes,
op and scale factors as allreduce) and each rank keeps its slice. gloo has no reduce-scatter, and
this moves about twice the bytes of a real one; it is correct on every backend and any split.
"""

from __future__ import annotations

from typing import Any

import torch

from shoal.horovod import state
from shoal.horovod.compression import Compression, check_compressor
from shoal.horovod.errors import HorovodUsageError
from shoal.horovod.exchange import start_gather
from shoal.horovod.grouped import as_tensor_list
from shoal.horovod.ops import Average, Handle, ReduceOp, resolve_op, start_reduce


def rows_of(rank: int, rows: int, world: int) -> tuple[int, int]:
    """(first row, row count) that ``rank`` keeps of ``rows`` split over ``world`` ranks (Horovod's split)."""
    base, extra = divmod(rows, world)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


def _start(call, tensors, name, op, prescale_factor, postscale_factor, process_set) -> Handle:
    reduce_op = resolve_op(op, None, f"{call}()")
    state.check_process_set(process_set, call)
    for tensor in tensors:
        if tensor.dim() == 0:
            raise HorovodUsageError(
                f"hvd.{call}: a 0-d tensor has no rows to scatter", "pass a tensor with a first dimension"
            )
    copies = [t.detach().clone(memory_format=torch.contiguous_format) for t in tensors]
    reduced = start_reduce(call, copies, name, reduce_op, prescale_factor, postscale_factor)
    rank, world = state.rank(), state.size()

    def keep_mine(whole: list[torch.Tensor]) -> list[torch.Tensor]:
        return [t.narrow(0, *rows_of(rank, t.shape[0], world)).clone() for t in whole]

    return reduced.then(keep_mine)


def reducescatter_async(
    tensor: torch.Tensor,
    name: str | None = None,
    op: Any = Average,
    process_set: Any = state.global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Start a reducescatter; ``synchronize`` returns this rank's rows of the reduced tensor."""
    handle = _start("reducescatter", [tensor], name, op, prescale_factor, postscale_factor, process_set)
    return handle.then(lambda mine: mine[0])


def grouped_reducescatter_async(
    tensors,
    name=None,
    op=Average,
    process_set=state.global_process_set,
    prescale_factor=1.0,
    postscale_factor=1.0,
) -> Handle:
    """Start a reducescatter of each tensor of the list; ``synchronize`` returns this rank's rows of each."""
    items = as_tensor_list(tensors, "grouped_reducescatter")
    return _start("grouped_reducescatter", items, name, op, prescale_factor, postscale_factor, process_set)


def _backward_scale(op: ReduceOp, pre: float, post: float) -> float:
    """Horovod's reducescatter gradient: ``size()`` times for Sum, times both scale factors."""
    return (state.size() if op is ReduceOp.Sum else 1.0) * pre * post


class _Reducescatter(torch.autograd.Function):
    """Differentiable (grouped) reducescatter; the gradient is gathered back (as Horovod's)."""

    @staticmethod
    def forward(ctx, call, name, op, prescale_factor, postscale_factor, *tensors):  # type: ignore[override]
        ctx.scale = _backward_scale(resolve_op(op, None, f"{call}()"), prescale_factor, postscale_factor)
        handle = _start(call, list(tensors), name, op, prescale_factor, postscale_factor, state.global_process_set)
        return tuple(handle.wait())

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        scaled = [(g * ctx.scale).contiguous() for g in grads]
        return (None, None, None, None, None, *start_gather("grouped_allgather", scaled, None).wait())


def reducescatter(
    tensor: torch.Tensor,
    name: str | None = None,
    compression: Any = Compression.none,
    op: Any = Average,
    process_set: Any = state.global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """``tensor`` averaged (default) or reduced with ``op`` across ranks; this rank's rows of it."""
    state.check_process_set(process_set, "reducescatter")
    compressor = check_compressor(compression)
    wire, context = compressor.compress(tensor)
    (mine,) = _Reducescatter.apply("reducescatter", name, op, prescale_factor, postscale_factor, wire)
    return compressor.decompress(mine, context)


def grouped_reducescatter(
    tensors,
    name=None,
    compression=Compression.none,
    op=Average,
    process_set=state.global_process_set,
    prescale_factor=1.0,
    postscale_factor=1.0,
) -> list[torch.Tensor]:
    """Each tensor of the list reduced across ranks; this rank's rows of each."""
    state.check_process_set(process_set, "grouped_reducescatter")
    compressor = check_compressor(compression)
    wires, contexts = zip(*(compressor.compress(t) for t in as_tensor_list(tensors, "grouped_reducescatter")))
    mine = _Reducescatter.apply("grouped_reducescatter", name, op, prescale_factor, postscale_factor, *wires)
    return [compressor.decompress(t, context) for t, context in zip(mine, contexts)]
