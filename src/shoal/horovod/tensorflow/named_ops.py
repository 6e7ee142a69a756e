"""Horovod's graph-time ops for the job's shape: ``rank_op``, ``local_rank_op``, ``size_op``, ``local_size_op``.

Horovod 0.28 (``horovod/tensorflow/mpi_ops.py``) makes each an int32 scalar op evaluated when the
graph runs. The job's shape does not change while a process lives here, so each is a constant
of the value at the time it is built (after ``hvd.init()``, as Horovod requires).
"""

from __future__ import annotations

from typing import Any

from shoal.horovod import state
from shoal.horovod.tensorflow.framework import tf


def _op(value: int, name: str | None) -> Any:
    return tf.constant(value, dtype=tf.int32, name=name)


def rank_op(name: str | None = None) -> Any:
    """This process's rank, as an int32 scalar tensor."""
    return _op(state.rank(), name)


def local_rank_op(name: str | None = None) -> Any:
    """This process's rank on its node, as an int32 scalar tensor."""
    return _op(state.local_rank(), name)


def size_op(process_set_id: int = 0, name: str | None = None) -> Any:
    """The number of processes, as an int32 scalar tensor."""
    if process_set_id != 0:
        state.check_process_set(process_set_id, "size_op")
    return _op(state.size(), name)


def local_size_op(name: str | None = None) -> Any:
    """The number of processes on this node, as an int32 scalar tensor."""
    return _op(state.local_size(), name)
