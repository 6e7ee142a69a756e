"""The collectives of ``horovod.tensorflow.keras`` (Horovod 0.28's ``horovod/_keras/__init__.py``): values in, tensors out.

Keras's forms take any value (a number, a NumPy array, a tensor), make it a tensor and run the
TensorFlow collective (:mod:`.collectives`).
"""

from __future__ import annotations

from typing import Any

from shoal.horovod import ops as engine
from shoal.horovod.tensorflow import collectives
from shoal.horovod.tensorflow.compression import Compression
from shoal.horovod.tensorflow.framework import tf


def allreduce(value: Any, name: str | None = None, average: bool | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, op: Any = None, compression: Any = Compression.none) -> Any:  # fmt: skip
    """``value`` averaged (default) or reduced with ``op`` over all ranks."""
    return collectives.allreduce(
        tf.constant(value) if not tf.is_tensor(value) else value,
        average=average,
        compression=compression,
        op=op,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        name=name,
    )


def allgather(value: Any, name: str | None = None) -> Any:
    """Every rank's ``value`` concatenated along dimension 0."""
    return collectives.allgather(tf.convert_to_tensor(value), name=name)


def broadcast(value: Any, root_rank: int, name: str | None = None) -> Any:
    """root_rank's ``value`` on every rank."""
    return collectives.broadcast(tf.convert_to_tensor(value), root_rank, name=name)


def reducescatter(value: Any, name: str | None = None, op: Any = engine.Average) -> Any:
    """``value`` reduced over all ranks; this rank's rows of it."""
    return collectives.reducescatter(tf.convert_to_tensor(value), op=op, name=name)
