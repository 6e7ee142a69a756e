"""Running a torch-side collective on TF tensors: directly when eager, through ``tf.py_function`` in graphs.

Inside ``tf.function``, ``model.fit`` and TF1 graph mode a collective becomes one
``tf.py_function`` node whose body runs eagerly: the inputs cross to torch (:mod:`.bridge`), the
torch engine runs the collective, the outputs cross back. XLA cannot compile a ``py_function``,
so models whose optimizer is distributed must not be jit-compiled (the callbacks turn
``jit_compile`` off with one warning).

``tf.py_function`` turns any Python exception into a TF error and loses its type; the ShoalError
raised inside is remembered (:func:`~shoal.horovod.errors.remember`) so that the
process still prints its one line and HINT if nothing catches it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from shoal.errors import ShoalError
from shoal.horovod import errors
from shoal.horovod.tensorflow import tf_errors
from shoal.horovod.tensorflow.bridge import to_tf, to_torch
from shoal.horovod.tensorflow.framework import tf

Compute = Callable[[list[torch.Tensor]], Sequence[torch.Tensor]]


def executing_eagerly() -> bool:
    """True when ops run now (eager), False while a graph is built (``tf.function``, TF1 graphs);
    Horovod's ``_executing_eagerly``."""
    return tf.executing_eagerly()


def run(compute: Compute, inputs: Sequence[Any], out_dtypes: Sequence[Any], out_shapes: Sequence[Any]) -> list[Any]:
    """``compute`` (torch tensors in, torch tensors out) on TF ``inputs``; the TF outputs.

    ``out_shapes`` are the static shapes the graph gets (None or partly unknown where ranks differ).
    """
    wide = [WIDER.get(tf.as_dtype(dtype)) for dtype in out_dtypes]
    if any(wide) or any(tf.as_dtype(t.dtype) in WIDER for t in inputs):  # e.g. uint16: torch cannot move it
        inputs = [tf.cast(t, WIDER[t.dtype]) if t.dtype in WIDER else t for t in inputs]
        outputs = run(compute, inputs, [w or d for w, d in zip(wide, out_dtypes)], out_shapes)
        return [tf.cast(o, d) if w else o for o, w, d in zip(outputs, wide, out_dtypes)]
    if tf.executing_eagerly():
        return _run_now(compute, inputs)
    graph = tf.compat.v1.get_default_graph()
    if getattr(graph, "building_function", False):  # tf.function: its automatic control dependencies order it
        outputs = tf.py_function(lambda *ts: _run_now(compute, ts), list(inputs), list(out_dtypes))
    else:
        outputs = _run_in_tf1_graph(graph, compute, inputs, out_dtypes)
    for output, shape in zip(outputs, out_shapes):
        if shape is not None:
            output.set_shape(shape)
    return list(outputs)


WIDER = {tf.uint16: tf.int32}
"""TF dtypes torch's collectives cannot move, and the dtype each travels as (exactly: every value fits)."""

_lock = threading.RLock()
"""One collective at a time per process: TF runs independent graph nodes on several threads."""


def _run_now(compute: Compute, tensors: Sequence[Any]) -> list[Any]:
    with _lock:
        try:
            outputs = compute([to_torch(t) for t in tensors])
        except ShoalError as error:
            error = tf_errors.as_tf_error(error)
            errors.remember(error)
            raise error from None
    return [to_tf(out) for out in outputs]


_last_collective: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
"""Per TF1 graph: the op that ends the last collective built in it (see :func:`_run_in_tf1_graph`)."""


def _run_in_tf1_graph(graph: Any, compute: Compute, inputs: Sequence[Any], out_dtypes: Sequence[Any]) -> list[Any]:
    """The collective as a node of a TF1 graph, after the previous one built in it.

    A ``Session`` runs independent nodes in any order, on several threads, differently on each
    rank; collectives pair up by the order ranks issue them. Horovod's coordinator pairs them by
    name at run time instead, which needs asynchronous kernels (a ``py_function`` holds its thread
    until it returns, so ranks waiting for different ops would deadlock). Here each collective
    depends on the one built before it: every rank that builds the same graph runs its collectives
    in the same order, and the agreement check still compares their names.

    Ranks that disagree fail the node with ``FailedPreconditionError`` (:mod:`.tf_errors`).
    """
    dtypes = list(out_dtypes)

    def body(*tensors: Any) -> list[Any]:
        try:
            return [*_run_now(compute, tensors), tf.constant(False), _handle("ok")]
        except tf_errors.FailedPrecondition as error:
            return [*(tf.zeros([0], d) for d in dtypes), tf.constant(True), _handle(error.message)]

    chained = graph._get_control_flow_context() is None  # a v1 while/cond body cannot depend on outside ops
    before = [_last_collective[graph]] if chained and graph in _last_collective else []
    with tf.control_dependencies(before):
        *outputs, failed, handle = tf.py_function(body, list(inputs), [*dtypes, tf.bool, tf.resource])
        check = tf.cond(failed, lambda: tf_errors.failing_read(handle), lambda: tf.constant(0, tf.int8))
    if chained:
        _last_collective[graph] = check.op
    with tf.control_dependencies([check]):
        return [tf.identity(output) for output in outputs]


_handles: dict[str, Any] = {}


def _handle(name: str) -> Any:
    if name != "ok":
        return tf_errors.missing_handle(name)
    if name not in _handles:
        _handles[name] = tf_errors.missing_handle("ok: never read")
    return _handles[name]


def run_one(compute: Callable[[torch.Tensor], torch.Tensor], tensor: Any, shape: Any) -> Any:
    """:func:`run` for one tensor in, one of the same dtype out."""
    (out,) = run(lambda ts: [compute(ts[0])], [tensor], [tensor.dtype], [shape])
    return out
