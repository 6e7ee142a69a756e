"""Horovod's TensorFlow collectives (``horovod/tensorflow/__init__.py``, ``mpi_ops.py``, Horovod 0.28).

Each one runs the torch engine's collective of the same name (:mod:`shoal.horovod`:
the same cross-rank agreement checks, dtypes and scale factors) on the tensors' DLPack views
(:mod:`.graph`, :mod:`.bridge`), eagerly or as a ``tf.py_function`` in graphs. The engine works on
a copy of each input, so TF's memory is never written. Gradients follow Horovod's registered
ones: an allreduce's gradient is the same allreduce of the gradient; allgather's is the averaged
gradient's rows of this rank; broadcast's is the averaged gradient on the root, zero elsewhere.

``device_dense``, ``device_sparse`` and ``ignore_name_scope`` are accepted and have no effect:
the engine places work on the tensors' own device. ``name`` only takes part in the agreement check.
"""

from __future__ import annotations

from typing import Any

from shoal.horovod import exchange, grouped, scatter, state
from shoal.horovod import ops as engine
from shoal.horovod.errors import HorovodUnsupported, HorovodUsageError
from shoal.horovod.tensorflow.compression import Compression
from shoal.horovod.tensorflow.framework import tf
from shoal.horovod.tensorflow.graph import run, run_one

global_process_set = state.global_process_set


def _ragged(shape: Any) -> Any:
    """``shape`` with its first dimension unknown (it differs between ranks after a gather)."""
    shape = tf.TensorShape(shape)
    return tf.TensorShape([None]).concatenate(shape[1:]) if shape.rank else None


# ---- allreduce ------------------------------------------------------------------------------------


def _allreduce(tensor: Any, op: engine.ReduceOp, prescale: float, postscale: float, name: str | None) -> Any:
    @tf.custom_gradient
    def reduce(x: Any) -> Any:
        out = run_one(lambda t: engine.allreduce_async(t, None, name, op, prescale, postscale).wait(), x, x.shape)
        return out, lambda dy: _allreduce(dy, op, prescale, postscale, None)

    return reduce(tensor)


def allreduce(
    tensor: Any,
    average: bool | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: str | None = None,
    process_set: Any = global_process_set,
    ignore_name_scope: bool = False,
) -> Any:
    """``tensor`` averaged (default) or reduced with ``op`` over all ranks; an ``IndexedSlices`` is
    all-gathered (values and indices), its values divided by ``size()`` for Average, as Horovod."""
    reduce_op = engine.resolve_op(op, average, "allreduce()")
    engine.check_ready("allreduce()")
    state.check_process_set(process_set, "allreduce")
    if isinstance(tensor, tf.IndexedSlices):
        _check_sparse(reduce_op, prescale_factor, postscale_factor)
        values = allgather(tensor.values, name=None if name is None else f"{name}.values")
        indices = allgather(tensor.indices, name=None if name is None else f"{name}.indices")
        return _sparse_result(values, indices, tensor, reduce_op)
    wire, context = compression.compress(tf.convert_to_tensor(tensor))
    return compression.decompress(_allreduce(wire, reduce_op, prescale_factor, postscale_factor, name), context)


def grouped_allreduce(
    tensors: Any,
    average: bool | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> list[Any]:
    """Each tensor of the list reduced as :func:`allreduce` does, in one agreement step and one
    collective per dtype (Horovod's fused group)."""
    reduce_op = engine.resolve_op(op, average, "grouped_allreduce()")
    engine.check_ready("grouped_allreduce()")
    state.check_process_set(process_set, "grouped_allreduce")
    tensors = _as_list(tensors, "grouped_allreduce")
    results: list[Any] = [None] * len(tensors)
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    if sparse:  # Horovod's rule: values and indices gathered (one group each), Average divides by size()
        _check_sparse(reduce_op, prescale_factor, postscale_factor)
        values = grouped_allgather([tensors[i].values for i in sparse])
        indices = grouped_allgather([tensors[i].indices for i in sparse])
        for i, v, k in zip(sparse, values, indices):
            results[i] = _sparse_result(v, k, tensors[i], reduce_op)
    if dense:
        pairs = [compression.compress(tf.convert_to_tensor(tensors[i])) for i in dense]
        reduced = _grouped_allreduce([wire for wire, _ in pairs], reduce_op, prescale_factor, postscale_factor)
        for i, out, (_, context) in zip(dense, reduced, pairs):
            results[i] = compression.decompress(out, context)
    return results


def _check_sparse(op: engine.ReduceOp, prescale: float, postscale: float) -> None:
    """Horovod's limits for IndexedSlices: Sum or Average, no scale factors (NotImplementedError)."""
    if op not in (engine.ReduceOp.Sum, engine.ReduceOp.Average):
        raise HorovodUnsupported(
            f"hvd.allreduce: op={op.name} on tf.IndexedSlices: only Sum and Average ops are supported with "
            "tf.IndexedSlices (as Horovod)",
            "reduce the dense tensor (tf.convert_to_tensor) or use op=hvd.Sum or hvd.Average",
        )
    if prescale != 1.0 or postscale != 1.0:
        raise HorovodUnsupported(
            "hvd.allreduce: pre/postscale_factor are not supported with tf.IndexedSlices (as Horovod)",
            "scale the values yourself, or reduce the dense tensor",
        )


def _sparse_result(values: Any, indices: Any, like: Any, op: engine.ReduceOp) -> Any:
    if op is engine.ReduceOp.Average:
        values = values / tf.cast(state.size(), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=like.dense_shape)


def _grouped_allreduce(tensors: list[Any], op: engine.ReduceOp, prescale: float, postscale: float) -> list[Any]:
    @tf.custom_gradient
    def reduce(*xs: Any) -> Any:
        outs = run(
            lambda ts: grouped.grouped_allreduce_async(ts, None, None, op, prescale, postscale).wait(),
            xs,
            [x.dtype for x in xs],
            [x.shape for x in xs],
        )
        return outs, lambda *dys: _grouped_allreduce(list(dys), op, prescale, postscale)

    return list(reduce(*tensors))


def _as_list(tensors: Any, call: str) -> list[Any]:
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise HorovodUsageError(
            f"hvd.{call}: tensors must be a non-empty list of tensors, got {type(tensors).__name__}",
            f"pass a list, e.g. hvd.{call}([a, b])",
        )
    return list(tensors)


# ---- allgather, broadcast, alltoall ---------------------------------------------------------------


def allgather(
    tensor: Any, name: str | None = None, ignore_name_scope: bool = False, process_set: Any = global_process_set
) -> Any:
    """Every rank's ``tensor`` concatenated along dimension 0 in rank order (first dimensions may differ)."""
    engine.check_ready("allgather()")
    state.check_process_set(process_set, "allgather")
    return _allgather(tf.convert_to_tensor(tensor), name)


def _allgather(tensor: Any, name: str | None) -> Any:
    @tf.custom_gradient
    def gather(x: Any) -> Any:
        out = run_one(lambda t: exchange.allgather_async(t, name).wait(), x, _ragged(x.shape))

        return out, lambda dy: _own_rows(dy, x)

    return gather(tensor)


def grouped_allgather(tensors: Any, process_set: Any = global_process_set) -> list[Any]:
    """:func:`allgather` of each tensor of the list, in one agreement step."""
    engine.check_ready("grouped_allgather()")
    state.check_process_set(process_set, "grouped_allgather")
    items = [tf.convert_to_tensor(t) for t in _as_list(tensors, "grouped_allgather")]

    @tf.custom_gradient
    def gather(*xs: Any) -> Any:
        outs = run(lambda ts: grouped.grouped_allgather_async(ts).wait(), xs, [x.dtype for x in xs],
                   [_ragged(x.shape) for x in xs])  # fmt: skip
        return outs, lambda *dys: [_own_rows(dy, x) for dy, x in zip(dys, xs)]

    return list(gather(*items))


def _own_rows(dy: Any, x: Any) -> Any:
    """allgather's gradient (Horovod's): the averaged gradient's rows that came from this rank."""
    reduced = _allreduce(dy, engine.ReduceOp.Average, 1.0, 1.0, None)
    rows = _allgather(tf.shape(x)[:1], None)
    offset = tf.reduce_sum(rows[: state.rank()])
    return reduced[offset : offset + tf.shape(x)[0]]


def broadcast(
    tensor: Any,
    root_rank: int,
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: Any = global_process_set,
) -> Any:
    """root_rank's ``tensor`` on every rank (a new tensor)."""
    engine.check_ready("broadcast()")
    state.check_process_set(process_set, "broadcast")
    exchange.check_root(root_rank, "broadcast()")
    return _broadcast(tf.convert_to_tensor(tensor), root_rank, name)


def _broadcast(tensor: Any, root_rank: int, name: str | None) -> Any:
    @tf.custom_gradient
    def cast(x: Any) -> Any:
        out = run_one(lambda t: exchange.broadcast_async(t, root_rank, name).wait(), x, x.shape)

        def grad(dy: Any) -> Any:
            reduced = _allreduce(dy, engine.ReduceOp.Average, 1.0, 1.0, None)
            # reduced * 0, not zeros_like: every rank must run the allreduce (zeros_like of a known
            # shape does not), as Horovod's _broadcast_grad does
            return reduced if state.rank() == root_rank else reduced * 0

        return out, grad

    return cast(tensor)


def alltoall(
    tensor: Any,
    splits: Any = None,
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: Any = global_process_set,
) -> Any:
    """Rank r sends ``splits[r]`` rows (an even split by default) to each rank; returns
    ``(received tensor, received splits)`` when ``splits`` is given, else the received tensor, as
    Horovod's TF ``alltoall`` does."""
    engine.check_ready("alltoall()")
    state.check_process_set(process_set, "alltoall")
    tensor = tf.convert_to_tensor(tensor)
    if splits is None:
        return _alltoall(tensor, None, name)[0]  # Horovod returns the tensor alone without splits
    return _alltoall(tensor, tf.cast(tf.convert_to_tensor(splits), tf.int32), name)


def _alltoall(tensor: Any, splits: Any, name: str | None) -> tuple[Any, Any]:
    """alltoall with Horovod's gradient: the gradient sent back along the received splits."""
    received_splits: list[Any] = []

    @tf.custom_gradient
    def exchange_rows(x: Any) -> Any:
        inputs = [x] if splits is None else [x, splits]
        out, received = run(
            lambda ts: exchange.alltoall_async(ts[0], None if len(ts) == 1 else ts[1].tolist(), name).wait(),
            inputs,
            [x.dtype, tf.int32],
            [_ragged(x.shape), [state.size()]],
        )
        received_splits.append(received)
        return out, lambda dy: _alltoall(dy, received, None)[0]

    out = exchange_rows(tensor)
    return out, received_splits[0]


# ---- reducescatter --------------------------------------------------------------------------------


def reducescatter(
    tensor: Any,
    device_dense: str = "",
    compression: Any = Compression.none,
    op: Any = engine.Average,
    name: str | None = None,
    process_set: Any = global_process_set,
    ignore_name_scope: bool = False,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Any:
    """``tensor`` reduced over all ranks (Average by default, as Horovod's), this rank's rows of it."""
    engine.check_ready("reducescatter()")
    reduce_op = engine.resolve_op(op, None, "reducescatter()")
    wire, context = compression.compress(tf.convert_to_tensor(tensor))
    (out,) = _reducescatter([wire], reduce_op, process_set, prescale_factor, postscale_factor, name, grouped=False)
    return compression.decompress(out, context)


def _reducescatter(tensors: list[Any], op: engine.ReduceOp, process_set: Any, pre: float, post: float,
                   name: str | None, grouped: bool) -> list[Any]:  # fmt: skip
    """reducescatter with Horovod's gradient (``mpi_ops.py`` ``_reducescatter_grad``): the gradient
    all-gathered, times ``size()`` for Sum and times the scale factors."""

    @tf.custom_gradient
    def scatter_rows(*xs: Any) -> Any:
        def compute(ts: list[Any]) -> Any:
            if grouped:
                return scatter.grouped_reducescatter_async(ts, None, op, process_set, pre, post).wait()
            return [scatter.reducescatter_async(ts[0], name, op, process_set, pre, post).wait()]

        outs = run(compute, xs, [x.dtype for x in xs], [_ragged(x.shape) for x in xs])

        def grad(*dys: Any) -> Any:
            factor = (state.size() if op is engine.ReduceOp.Sum else 1) * pre * post
            return [_allgather(dy * factor if factor != 1 else dy, None) for dy in dys]

        return outs, grad

    return list(scatter_rows(*tensors))


def grouped_reducescatter(
    tensors: Any,
    device_dense: str = "",
    compression: Any = Compression.none,
    op: Any = engine.Average,
    process_set: Any = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[Any]:
    """:func:`reducescatter` of each tensor of the list, in one agreement step."""
    engine.check_ready("grouped_reducescatter()")
    reduce_op = engine.resolve_op(op, None, "grouped_reducescatter()")
    pairs = [compression.compress(tf.convert_to_tensor(t)) for t in _as_list(tensors, "grouped_reducescatter")]
    outs = _reducescatter(
        [wire for wire, _ in pairs], reduce_op, process_set, prescale_factor, postscale_factor, None, grouped=True
    )
    return [compression.decompress(out, context) for out, (_, context) in zip(outs, pairs)]
