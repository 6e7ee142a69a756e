"""Variables and Python objects across ranks: ``broadcast_variables``, ``broadcast_object``, ``allgather_object``.

As Horovod's (``horovod/tensorflow/functions.py``, 0.28): root's variable values are assigned to
every rank's variables. The values travel in a few flat buckets (the engine's
``broadcast_tensors_``), one ``tf.py_function`` in graphs, after one check that every rank
broadcasts the same variables (shapes, dtypes). Keras 3 variables work as tf.Variables do.
"""

from __future__ import annotations

from typing import Any

from shoal.horovod import functions, state
from shoal.horovod.exchange import check_root
from shoal.horovod.ops import check_ready
from shoal.horovod.tensorflow.framework import tf
from shoal.horovod.tensorflow.graph import run

global_process_set = state.global_process_set


def _broadcast_values(torch_values: list[Any], root_rank: int) -> list[Any]:
    signature = functions.tensor_signature((None, t) for t in torch_values)
    functions.check_same_on_every_rank(
        signature, "the variables to broadcast", "broadcast the same variables (same model) on every rank"
    )
    # The inputs are views of TF memory, never written: the receiving ranks get copies to fill.
    copies = torch_values if state.rank() == root_rank else [t.clone() for t in torch_values]
    functions.broadcast_tensors_(copies, root_rank)
    return copies


def broadcast_variables(variables: Any, root_rank: int, process_set: Any = global_process_set, inplace: bool = False):
    """Assign root_rank's values to ``variables`` on every rank; in graphs, returns the assign op.

    No variables: nothing to do, before ``hvd.init()`` too (Horovod's graph of no broadcasts).
    """
    variables = list(variables)
    if not variables:
        return tf.no_op() if not tf.executing_eagerly() else None
    check_ready("broadcast_variables()")
    state.check_process_set(process_set, "broadcast_variables")
    check_root(root_rank, "broadcast_variables()")
    if state.size() == 1:
        return tf.no_op() if not tf.executing_eagerly() else None
    values = [tf.convert_to_tensor(v) for v in variables]
    received = run(
        lambda ts: _broadcast_values(ts, root_rank), values, [v.dtype for v in values], [v.shape for v in values]
    )
    assigns = [v.assign(r) for v, r in zip(variables, received)]
    return None if tf.executing_eagerly() else tf.group(*assigns)


def broadcast_object(obj: Any, root_rank: int = 0, session: Any = None, name: str | None = None,
                     process_set: Any = global_process_set) -> Any:  # fmt: skip
    """root_rank's ``obj`` (anything picklable) on every rank."""
    return functions.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj: Any, session: Any = None, name: str | None = None, process_set: Any = global_process_set):
    """Every rank's ``obj``, in rank order."""
    return functions.allgather_object(obj, name, process_set)


def broadcast_global_variables(root_rank: int) -> Any:
    """TF1 graph mode: root's values of every global variable; eagerly a RuntimeError, as Horovod's."""
    if tf.executing_eagerly():
        raise RuntimeError(
            "hvd.broadcast_global_variables() does not support eager execution. "
            "Please use `hvd.broadcast_variables(<model/optimizer variables>)` instead."
        )
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def broadcast_(variables: Any, root_rank: int, name: str | None = None, process_set: Any = global_process_set):
    """In place: root_rank's values assigned to ``variables`` on every rank; their new values (a list).

    Horovod's ``broadcast_`` (TF 2.6+) writes into the variables' buffers from its op; here one
    broadcast of the values and an assign per variable do the same, in graphs as one step.
    """
    check_ready("broadcast_()")
    state.check_process_set(process_set, "broadcast_")
    check_root(root_rank, "broadcast_()")
    variables = list(variables)
    if not variables:
        return []
    values = [tf.convert_to_tensor(v) for v in variables]
    received = run(
        lambda ts: _broadcast_values(ts, root_rank), values, [v.dtype for v in values], [v.shape for v in values]
    )
    if tf.executing_eagerly():
        for variable, value in zip(variables, received):
            variable.assign(value)
        return [tf.convert_to_tensor(v) for v in variables]
    assigns = [v.assign(r) for v, r in zip(variables, received)]
    with tf.control_dependencies(assigns):
        return [tf.identity(a) for a in assigns]


def broadcast_object_fn(root_rank: int = 0, session: Any = None, name: str | None = None,
                        process_set: Any = global_process_set) -> Any:  # fmt: skip
    """A function ``f(obj)`` returning root_rank's ``obj`` on every rank (Horovod's TF1 helper; no
    session is needed here, the object travels outside the graph)."""
    state.check_process_set(process_set, "broadcast_object_fn")
    return lambda obj: functions.broadcast_object(obj, root_rank, name, process_set)
