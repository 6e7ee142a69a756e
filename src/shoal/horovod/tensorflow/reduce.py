"""The gradients of one step, all-reduced: the shared core of ``DistributedOptimizer`` and ``DistributedGradientTape``.

Dense gradients of one dtype travel in one flat buffer (Horovod's fusion), by the cheaper of two
ways for where the step runs (both measured: docs/BENCHMARKS.md, "The horovod variant"):

- in graphs (``tf.function``, ``model.fit``): TF packs them (``tf.concat``, the copy DDP's buckets
  make too), the buffer crosses to torch by DLPack once, is all-reduced in place and comes back as
  the same memory, and TF splits it (graph ops cost little; one ``tf.py_function`` per dtype);
- eagerly (a custom loop with the tape): each gradient crosses as a DLPack view, torch packs them
  into a buffer whose slices start 64-byte aligned, and the slices go back to TF as views (eager
  TF ops cost tens of microseconds each, more than the crossings).

The first step checks once that every rank reduces the same gradients (count, shapes, dtypes);
later steps follow that layout by construction, as the torch DistributedOptimizer's buckets do.
``IndexedSlices`` (embeddings) are all-gathered as Horovod
does, or made dense with ``sparse_as_dense``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from shoal.horovod import agreement, state
from shoal.horovod import ops as engine
from shoal.horovod.errors import HorovodUsageError
from shoal.horovod.tensorflow.bridge import aligned_views
from shoal.horovod.tensorflow.collectives import allreduce
from shoal.horovod.tensorflow.compression import Compression
from shoal.horovod.tensorflow.framework import tf
from shoal.horovod.tensorflow.graph import run


@dataclass
class GradientSettings:
    """How a step's gradients are combined (the arguments of DistributedOptimizer / DistributedGradientTape)."""

    op: engine.ReduceOp = engine.ReduceOp.Average
    compression: Any = Compression.none
    sparse_as_dense: bool = False
    prescale: float = 1.0
    postscale: float = 1.0
    checked: bool = field(default=False, compare=False)
    """Set once every rank has been seen to reduce the same gradients."""


def settings_for(
    op: Any, compression: Any, sparse_as_dense: bool, gradient_predivide_factor: float, call: str
) -> GradientSettings:
    """Horovod's argument rules: ``gradient_predivide_factor`` only with Average, where it becomes a
    Sum scaled by ``1/f`` before and ``f/size`` after."""
    reduce_op = engine.resolve_op(op, None, call)
    if gradient_predivide_factor != 1.0:
        if reduce_op is not engine.ReduceOp.Average:
            raise HorovodUsageError(
                f"hvd.{call}: gradient_predivide_factor is only supported with op=hvd.Average",
                "drop gradient_predivide_factor, or use op=hvd.Average",
            )
        return GradientSettings(
            engine.ReduceOp.Sum,
            compression,
            sparse_as_dense,
            1.0 / gradient_predivide_factor,
            gradient_predivide_factor / state.size(),
        )
    return GradientSettings(reduce_op, compression, sparse_as_dense)


def reduce_gradients(grads: list[Any], settings: GradientSettings, scale: float = 1.0) -> list[Any]:
    """``grads`` (None allowed) combined over all ranks; ``scale`` multiplies the result."""
    if state.size() == 1:
        return grads
    post = settings.postscale * scale
    out: list[Any] = list(grads)
    dense: list[tuple[int, Any, Any]] = []
    for i, grad in enumerate(grads):
        if grad is None:
            continue
        if isinstance(grad, tf.IndexedSlices) and settings.sparse_as_dense:
            grad = tf.convert_to_tensor(grad)
        if isinstance(grad, tf.IndexedSlices):
            out[i] = allreduce(grad, op=settings.op)
            if post != 1.0 or settings.prescale != 1.0:
                out[i] = tf.IndexedSlices(out[i].values * (post * settings.prescale), out[i].indices, grad.dense_shape)
            continue
        wire, context = settings.compression.compress(grad)
        dense.append((i, wire, context))
    if dense and tf.executing_eagerly():
        wires = [wire for _, wire, _ in dense]
        reduced = run(lambda ts: _reduce_views(ts, settings, post), wires, [], [])
        for (i, _, context), result in zip(dense, reduced):
            out[i] = settings.compression.decompress(result, context)
    elif dense:
        for members in _by_dtype([wire for _, wire, _ in dense]):
            wires = [dense[k][1] for k in members]
            for k, result in zip(members, _reduce_packed(wires, settings, post)):
                out[dense[k][0]] = settings.compression.decompress(result, dense[k][2])
    return out


def _by_dtype(wires: list[Any]) -> list[list[int]]:
    groups: dict[Any, list[int]] = {}
    for k, wire in enumerate(wires):
        groups.setdefault(wire.dtype, []).append(k)
    return list(groups.values())


def _reduce_packed(wires: list[Any], settings: GradientSettings, post: float) -> list[Any]:
    """Tensors of one dtype packed by TF into one buffer, reduced there in place, split by TF again.

    ``tf.concat`` of two or more tensors writes a new buffer that nothing else holds, so the
    all-reduce may write into it (its DLPack view); a lone tensor is reduced in a copy instead.
    """
    fresh = len(wires) > 1
    flat = tf.concat([tf.reshape(w, [-1]) for w in wires], 0) if fresh else tf.reshape(wires[0], [-1])
    layout = repr([tuple(w.shape) for w in wires])
    (reduced,) = run(
        lambda ts: [_reduce_in_place(ts[0], fresh, layout, settings, post)], [flat], [flat.dtype], [flat.shape]
    )
    parts = tf.split(reduced, tf.stack([tf.size(w) for w in wires]), num=len(wires)) if fresh else [reduced]
    return [tf.reshape(part, tf.shape(w)) for part, w in zip(parts, wires)]


def _reduce_in_place(flat: torch.Tensor, fresh: bool, layout: str, settings: GradientSettings, post: float):
    if not settings.checked:  # once: every rank reduces the same gradients (count, shapes, dtype)
        agreement.agree("DistributedOptimizer", [flat], None, {"op": settings.op, "gradients": layout})
        settings.checked = True
    target = flat if fresh else flat.clone()
    engine.start_reduce(
        "DistributedOptimizer", [target], None, settings.op, settings.prescale, post, agree=False
    ).wait()
    return target


def _reduce_views(tensors: list[torch.Tensor], settings: GradientSettings, post: float) -> list[torch.Tensor]:
    if not settings.checked:
        agreement.agree("DistributedOptimizer", tensors, None, {"op": settings.op})
        settings.checked = True
    kinds: dict[tuple[torch.dtype, torch.device], list[int]] = {}
    for i, tensor in enumerate(tensors):
        kinds.setdefault((tensor.dtype, tensor.device), []).append(i)
    results: list[Any] = [None] * len(tensors)
    handles = []
    for (dtype, device), members in kinds.items():
        flat, views = aligned_views([tensors[i].numel() for i in members], dtype, device)
        flat.zero_()  # the padding between slices takes part in the sum
        for i, view in zip(members, views):
            view.copy_(tensors[i].reshape(-1))
            results[i] = view.view(tensors[i].shape)
        handles.append(
            engine.start_reduce("DistributedOptimizer", [flat], None, settings.op, settings.prescale, post, agree=False)
        )
    for handle in handles:
        handle.wait()
    return results
