"""Horovod's reduction ops and ``allreduce`` family, run by ``torch.distributed``; handles for async calls.

The collectives that move data (allgather, broadcast, alltoall, barrier) are in :mod:`.exchange`.

Names, arguments and defaults follow ``horovod/torch/mpi_ops.py`` (Horovod 0.28): the out-of-place
forms return a new tensor and are differentiable as Horovod's are; the ``_`` forms work in place;
the ``_async`` forms return a handle for :func:`synchronize` / :func:`poll`. torch.distributed matches
collectives by the order ranks issue them, not by name, so every rank must issue the same
collectives in the same order (Horovod's coordinator would reorder them); before each one the
ranks check that they agree (:mod:`.agreement`: shape, dtype, name, op, scale factors), and a
mismatch is the same one-line error on every rank. With one process every call works locally.

Average is a sum followed by a division by ``size()`` (gloo has no average; integer tensors are
divided with truncation, as Horovod does). ``prescale_factor`` multiplies before the sum,
``postscale_factor`` after it.
"""

from __future__ import annotations

import enum
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from shoal.horovod import agreement, buckets, dtypes, state, unsupported
from shoal.horovod.compression import Compression, check_compressor
from shoal.horovod.errors import HorovodUnsupported, HorovodUsageError


class ReduceOp(enum.IntEnum):
    """Horovod's reduction ops, with Horovod's values (``horovod/common/message.h``)."""

    Average = 0
    Sum = 1
    Adasum = 2
    Min = 3
    Max = 4
    Product = 5


Average, Sum, Adasum, Min, Max, Product = (ReduceOp[name] for name in ReduceOp.__members__)

_TORCH_OPS = {
    ReduceOp.Average: dist.ReduceOp.SUM,
    ReduceOp.Sum: dist.ReduceOp.SUM,
    ReduceOp.Min: dist.ReduceOp.MIN,
    ReduceOp.Max: dist.ReduceOp.MAX,
    ReduceOp.Product: dist.ReduceOp.PRODUCT,
}


def resolve_op(op: Any, average: bool | None, call: str) -> ReduceOp:
    """Horovod's rule: ``op`` wins, the deprecated ``average`` maps to Average/Sum, default Average."""
    if op is not None and average is not None:
        raise HorovodUsageError(
            f"hvd.{call}: both op and average were given", "pass only op=hvd.Average or op=hvd.Sum (average is old)"
        )
    if op is None:
        if average is not None:
            warnings.warn("hvd: `average` is deprecated, use op=hvd.Average or hvd.Sum", DeprecationWarning, 3)
        return ReduceOp.Average if average in (None, True) else ReduceOp.Sum
    try:
        resolved = ReduceOp(op)
    except ValueError:
        raise HorovodUsageError(
            f"hvd.{call}: op={op!r} is not a reduction op", "use hvd.Average, hvd.Sum, hvd.Min, hvd.Max or hvd.Product"
        ) from None
    if resolved is ReduceOp.Adasum:
        raise unsupported.adasum(f"hvd.{call.removesuffix('()')}(op=hvd.Adasum)")
    return resolved


def check_ready(call: str) -> state._Job:
    """The job, after checking that a collective may run now (after init; no rank joined while the
    DistributedOptimizer's gradient all-reduces are all it can answer, see :mod:`.join`)."""
    job = state.job(call)
    if job.peers_joined():
        raise HorovodUnsupported(
            f"hvd.{call} after another rank called hvd.join(): shoal.horovod only keeps gradient "
            "reduction going for ranks that joined",
            "call hvd.join() on every rank when its data is done, then run the other collectives",
        )
    return job


def scale_(tensor: torch.Tensor, factor: float) -> None:
    """``tensor *= factor`` in place, truncating for integer tensors."""
    if factor == 1.0:
        return
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        tensor.mul_(factor)
    else:
        tensor.copy_((tensor.double() * factor).trunc())


def average_(tensor: torch.Tensor, count: int) -> None:
    """``tensor /= count`` in place (truncating division for integer tensors, as Horovod's)."""
    if count == 1:
        return
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        tensor.div_(count)
    else:
        tensor.copy_(torch.div(tensor, count, rounding_mode="trunc"))


# ---- handles --------------------------------------------------------------------------------------


class Handle:
    """An operation in flight: :func:`synchronize` waits and returns its result, :func:`poll` asks.

    Calling the handle also waits and returns the result (Horovod's ``sparse_allreduce_async``
    returns a function to call). A named handle keeps its name pending until it is waited for,
    whether or not the caller kept the handle.
    """

    def __init__(self, work: Any, finish: Callable[[], Any], name: str | None = None) -> None:
        works = work if isinstance(work, (list, tuple)) else [work]
        self._works = [w for w in works if w is not None]
        self._finish = finish
        self._done = False
        self._result: Any = None
        self._name = name
        agreement.hold(name, self)  # the job keeps it, name pending, until waited for: dropping it ends no op

    def poll(self) -> bool:
        return self._done or all(bool(w.is_completed()) for w in self._works)

    def wait(self) -> Any:
        if not self._done:
            for work in self._works:
                work.wait()
            self._result = self._finish()
            self._done = True
            self._works, self._finish = [], None  # type: ignore[assignment]
            agreement.release(self._name, self)
        return self._result

    __call__ = wait

    def then(self, transform: Callable[[Any], Any]) -> Handle:
        """A handle on the same operation whose result is ``transform(result)``."""
        return Handle(list(self._works), lambda: transform(self.wait()))


def synchronize(handle: Handle) -> Any:
    """Wait for an async operation; return its output (tensor, or tensors for alltoall with splits)."""
    return handle.wait()


def poll(handle: Handle) -> bool:
    """True once the operation is complete (then :func:`synchronize` does not block)."""
    return handle.poll()


# ---- allreduce ------------------------------------------------------------------------------------


def start_reduce(
    call: str,
    tensors: list[torch.Tensor],
    name: str | None,
    reduce_op: ReduceOp,
    prescale_factor: float,
    postscale_factor: float,
    *,
    agree: bool = True,
) -> Handle:
    """Reduce ``tensors`` in place across ranks, one collective per device and dtype; the result is the list.

    Ranks first agree on the call (:mod:`.agreement`), unless ``agree`` is False (a caller that
    checked its layout once, like the optimizers' gradient buffers). Several tensors of one kind travel packed in
    one flat buffer (Horovod's fusion); a dtype the backend lacks travels wider (:mod:`.dtypes`).
    """
    job = check_ready(f"{call}()")
    problem = None
    if not all(tensor.is_contiguous() for tensor in tensors):
        problem = ("a tensor is not contiguous", "pass tensor.contiguous()")
    settings = {"op": reduce_op, "prescale_factor": prescale_factor, "postscale_factor": postscale_factor}
    if agree or problem:
        agreement.agree(call, tensors, name, settings, problem=problem)
    world = job.context.world_size
    kinds: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for tensor in tensors:
        scale_(tensor, prescale_factor)
        kinds.setdefault((tensor.device, tensor.dtype), []).append(tensor)
    works, flats = [], []
    for (device, dtype), members in kinds.items():
        wire = dtypes.wire_dtype(dtype) if world > 1 else dtype
        flat = members[0]
        if len(members) > 1 or wire != dtype:
            flat = torch.empty(buckets.total_numel(members), dtype=wire, device=device)
            buckets.pack(members, flat)
        if world > 1:
            works.append(dist.all_reduce(flat, op=_TORCH_OPS[reduce_op], group=state.group_for(flat), async_op=True))
        flats.append((flat, members))

    def finish() -> list[torch.Tensor]:
        for flat, members in flats:
            if reduce_op is ReduceOp.Average:
                average_(flat, world)
            scale_(flat, postscale_factor)
            if flat is not members[0]:
                buckets.unpack(flat, members)
        return tensors

    return Handle(works, finish, name)


def reduce_zeros(submission: agreement.Submission) -> None:
    """A joined rank's part of the allreduce the others submitted: zeros of their shapes, dtypes and
    devices, through :func:`start_reduce` itself, so the collectives are theirs (summed: Sum and
    Average both sum)."""
    zeros = [
        torch.zeros(shape, dtype=getattr(torch, dtype), device=_device(device))
        for shape, dtype, device in submission.tensors
    ]
    start_reduce(submission.call, zeros, None, ReduceOp.Sum, 1.0, 1.0, agree=False).wait()


def _device(kind: str) -> torch.device:
    """A submission's device kind on this rank (``cuda``: this rank's GPU)."""
    return torch.device("cuda", torch.cuda.current_device()) if kind == "cuda" else torch.device(kind)


def allreduce_async_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = state.global_process_set,
) -> Handle:
    """Start reducing ``tensor`` in place across ranks; ``synchronize(handle)`` returns it reduced."""
    reduce_op = resolve_op(op, average, "allreduce_async_()")
    state.check_process_set(process_set, "allreduce_async_")
    return start_reduce("allreduce", [tensor], name, reduce_op, prescale_factor, postscale_factor).then(
        lambda reduced: reduced[0]
    )


def allreduce_async(
    tensor: torch.Tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=state.global_process_set,
) -> Handle:
    """Start reducing a copy of ``tensor`` (the input is left alone)."""
    out = tensor.detach().clone(memory_format=torch.contiguous_format)
    return allreduce_async_(out, average, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_(
    tensor: torch.Tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=state.global_process_set,
) -> torch.Tensor:
    """Reduce ``tensor`` in place across ranks (Average by default); returns it."""
    return allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set).wait()


class DifferentiableAllreduce(torch.autograd.Function):
    """Differentiable allreduce: the gradient is reduced the same way (as Horovod's)."""

    @staticmethod
    def forward(ctx, tensor, op, prescale_factor, postscale_factor, name=None):  # type: ignore[override]
        ctx.args = (op, prescale_factor, postscale_factor)
        return allreduce_async(tensor, None, name, op, prescale_factor, postscale_factor).wait()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        op, pre, post = ctx.args
        return DifferentiableAllreduce.apply(grad.contiguous(), op, pre, post), None, None, None, None


def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: Any = Compression.none,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = state.global_process_set,
) -> torch.Tensor:
    """``tensor`` averaged (default) or reduced with ``op`` across ranks, as a new tensor."""
    reduce_op = resolve_op(op, average, "allreduce()")
    check_ready("allreduce()")
    state.check_process_set(process_set, "allreduce")
    compressor = check_compressor(compression)
    wire, context = compressor.compress(tensor)
    return compressor.decompress(
        DifferentiableAllreduce.apply(wire, reduce_op, prescale_factor, postscale_factor, name), context
    )
