"""Horovod's grouped collectives: a list of tensors in one call, and sparse allreduce.

Names, arguments and defaults follow ``horovod/torch/mpi_ops.py`` (Horovod 0.28). A grouped call is
one agreement step for the whole list (:mod:`.agreement`: count, shapes, dtypes, op, scale
factors); ``grouped_allreduce`` then packs the tensors of each device and dtype into one flat
buffer and reduces it with one collective (Horovod fuses a group the same way). The out-of-place
forms leave their inputs alone and are differentiable, as Horovod's are.
"""

from __future__ import annotations

from typing import Any

import torch

from shoal.horovod import state
from shoal.horovod.compression import Compression, check_compressor
from shoal.horovod.errors import HorovodUsageError
from shoal.horovod.exchange import start_gather
from shoal.horovod.ops import Handle, ReduceOp, resolve_op, start_reduce


def as_tensor_list(tensors: Any, call: str) -> list[torch.Tensor]:
    """``tensors`` as a list; a HorovodUsageError naming ``hvd.<call>`` unless a non-empty list of tensors."""
    items = list(tensors) if isinstance(tensors, (list, tuple)) else None
    if not items or not all(isinstance(t, torch.Tensor) for t in items):
        raise HorovodUsageError(
            f"hvd.{call}: tensors must be a non-empty list of tensors, got {type(tensors).__name__}",
            f"pass a list, e.g. hvd.{call}([a, b])",
        )
    return items


# ---- grouped allreduce ----------------------------------------------------------------------------


def grouped_allreduce_async_(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=state.global_process_set,
) -> Handle:
    """Start reducing each tensor of the list in place across ranks; the handle's result is the list."""
    reduce_op = resolve_op(op, average, "grouped_allreduce_async_()")
    state.check_process_set(process_set, "grouped_allreduce_async_")
    items = as_tensor_list(tensors, "grouped_allreduce")
    return start_reduce("grouped_allreduce", items, name, reduce_op, prescale_factor, postscale_factor)


def grouped_allreduce_async(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=state.global_process_set,
) -> Handle:
    """Start reducing copies of the tensors (the inputs are left alone)."""
    copies = [
        t.detach().clone(memory_format=torch.contiguous_format) for t in as_tensor_list(tensors, "grouped_allreduce")
    ]
    return grouped_allreduce_async_(copies, average, name, op, prescale_factor, postscale_factor, process_set)


def grouped_allreduce_(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=state.global_process_set,
) -> list[torch.Tensor]:
    """Reduce each tensor of the list in place across ranks; returns the list."""
    return grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor, process_set).wait()


class _GroupedAllreduce(torch.autograd.Function):
    """Differentiable grouped allreduce: the gradients are reduced the same way (as Horovod's)."""

    @staticmethod
    def forward(ctx, op, prescale_factor, postscale_factor, name, *tensors):  # type: ignore[override]
        ctx.args = (op, prescale_factor, postscale_factor)
        return tuple(grouped_allreduce_async(list(tensors), None, name, op, prescale_factor, postscale_factor).wait())

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        op, pre, post = ctx.args
        reduced = _GroupedAllreduce.apply(op, pre, post, None, *(g.contiguous() for g in grads))
        return (None, None, None, None, *reduced)


def grouped_allreduce(
    tensors,
    average=None,
    name=None,
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=state.global_process_set,
) -> list[torch.Tensor]:
    """Each tensor of the list averaged (default) or reduced with ``op`` across ranks, as new tensors."""
    reduce_op = resolve_op(op, average, "grouped_allreduce()")
    state.check_process_set(process_set, "grouped_allreduce")
    compressor = check_compressor(compression)
    wires, contexts = zip(*(compressor.compress(t) for t in as_tensor_list(tensors, "grouped_allreduce")))
    reduced = _GroupedAllreduce.apply(reduce_op, prescale_factor, postscale_factor, name, *wires)
    return [compressor.decompress(t, context) for t, context in zip(reduced, contexts)]


# ---- grouped allgather ----------------------------------------------------------------------------


def grouped_allgather_async(tensors, name=None, process_set=state.global_process_set) -> Handle:
    """Start gathering each tensor of the list (concatenated along dimension 0, in rank order)."""
    state.check_process_set(process_set, "grouped_allgather_async")
    return start_gather("grouped_allgather", as_tensor_list(tensors, "grouped_allgather"), name)


class _GroupedAllgather(torch.autograd.Function):
    """Differentiable grouped allgather: each gradient averaged across ranks, this rank's rows kept."""

    @staticmethod
    def forward(ctx, name, *tensors):  # type: ignore[override]
        ctx.rows = [t.shape[0] for t in tensors]
        return tuple(grouped_allgather_async(list(tensors), name).wait())

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        reduced = _GroupedAllreduce.apply(ReduceOp.Average, 1.0, 1.0, None, *(g.contiguous() for g in grads))
        everyone = start_gather("grouped_allgather", [torch.tensor(ctx.rows)], None).wait()[0]
        before = everyone.view(state.size(), -1)[: state.rank()].sum(dim=0).tolist()
        return (None, *(g.narrow(0, int(off), rows) for g, off, rows in zip(reduced, before, ctx.rows)))


def grouped_allgather(tensors, name=None, process_set=state.global_process_set) -> list[torch.Tensor]:
    """Each tensor of the list gathered from every rank along dimension 0, as new tensors."""
    state.check_process_set(process_set, "grouped_allgather")
    return list(_GroupedAllgather.apply(name, *as_tensor_list(tensors, "grouped_allgather")))


# ---- sparse allreduce -----------------------------------------------------------------------------


def sparse_allreduce_async(tensor: torch.Tensor, name: str, op: Any, process_set: Any = state.global_process_set):
    """Reduce a sparse COO tensor: every rank's indices and values gathered (Horovod's method).

    Returns a handle; ``handle()`` (as in Horovod) or ``hvd.synchronize(handle)`` gives the sparse
    sum (``op=hvd.Sum``) or average (``op=hvd.Average``), uncoalesced, with the input's size.
    """
    reduce_op = resolve_op(op, None, "sparse_allreduce_async()")
    state.check_process_set(process_set, "sparse_allreduce_async")
    if reduce_op not in (ReduceOp.Sum, ReduceOp.Average) or not tensor.is_sparse:
        what = f"op={reduce_op.name}" if tensor.is_sparse else "a dense tensor"
        raise HorovodUsageError(
            f"hvd.sparse_allreduce_async: {what} is not supported (sparse COO tensors are summed or averaged)",
            "pass a sparse COO tensor (tensor.to_sparse()) with op=hvd.Sum or hvd.Average; hvd.allreduce for dense",
        )
    indices = tensor._indices().transpose(0, 1).contiguous()
    values = tensor._values().contiguous()
    base = name or "sparse"
    gathered = start_gather("sparse_allreduce", [indices, values], base)

    def assemble(parts: list[torch.Tensor]) -> torch.Tensor:
        all_indices, all_values = parts
        if reduce_op is ReduceOp.Average:
            all_values = all_values / state.size()
        return torch.sparse_coo_tensor(all_indices.transpose(0, 1), all_values, tensor.size(), check_invariants=False)

    return gathered.then(assemble)
