"""Running a torch-side collective on TF tensors: directly when eager, through ``tf.py_function`` in graphs.

Inside ``tf.function``, ``model.fit`` and TF1 graph mode a collective becomes one
``tf.py_function`` node whose body runs eagerly: the inputs cross to torch (:mod:`.bridge`), the
torch engine runs the collective, the outputs cross back. XLA cannot compile a ``py_function``,
so models whose optimizer is distributed must not be jit-compiled (the callbacks turn
``jit_compile`` off with one warning).

``tf.py_function`` turns any Python exception into a TF error and loses its type; the ShoalError
raised inside is remembered (:func:`~shoal.integrations.horovod.errors.remember`) so that the
process still prints its one line and HINT if nothing catches it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from shoal.errors import ShoalError
from shoal.integrations.horovod import errors
from shoal.integrations.horovod.tensorflow.bridge import to_tf, to_torch
from shoal.integrations.horovod.tensorflow.framework import tf

Compute = Callable[[list[torch.Tensor]], Sequence[torch.Tensor]]


def run(compute: Compute, inputs: Sequence[Any], out_dtypes: Sequence[Any], out_shapes: Sequence[Any]) -> list[Any]:
    """``compute`` (torch tensors in, torch tensors out) on TF ``inputs``; the TF outputs.

    ``out_shapes`` are the static shapes the graph gets (None or partly unknown where ranks differ).
    """

    def eager(*tensors: Any) -> list[Any]:
        try:
            outputs = compute([to_torch(t) for t in tensors])
        except ShoalError as error:
            errors.remember(error)
            raise
        return [to_tf(out) for out in outputs]

    if tf.executing_eagerly():
        return eager(*inputs)
    outputs = tf.py_function(eager, list(inputs), list(out_dtypes))
    for output, shape in zip(outputs, out_shapes):
        if shape is not None:
            output.set_shape(shape)
    return list(outputs)


def run_one(compute: Callable[[torch.Tensor], torch.Tensor], tensor: Any, shape: Any) -> Any:
    """:func:`run` for one tensor in, one of the same dtype out."""
    (out,) = run(lambda ts: [compute(ts[0])], [tensor], [tensor.dtype], [shape])
    return out
