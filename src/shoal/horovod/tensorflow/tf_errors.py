"""shoal.horovod's errors as the TensorFlow error classes Horovod's TF ops raise.

Horovod's ops fail through TensorFlow's status codes (``horovod/tensorflow/mpi_ops.cc``): ranks that
disagree are ``tf.errors.FailedPreconditionError``, bad arguments ``tf.errors.InvalidArgumentError``.
Each class here is both that TF class and the engine's :class:`~shoal.errors.ShoalError` (one line
and a HINT; ``except hvd.HorovodInternalError`` and ``except ValueError`` still catch them).

Eagerly they are raised as they are. In a graph the error happens inside a ``tf.py_function``, which
turns a ``ValueError`` into ``InvalidArgumentError`` but every other Python error into
``UnknownError`` (``tensorflow/python/lib/core/py_func.cc``); there is no Python way to raise
FailedPrecondition from it, so :mod:`.graph` hands the failure out of the py_function and fails a
``ReadVariableOp`` of a variable named by the message, which TensorFlow reports as
FailedPrecondition with the message inside.
"""

from __future__ import annotations

from typing import Any

from shoal.errors import ShoalError
from shoal.horovod.errors import HorovodMismatchError, HorovodUsageError
from shoal.horovod.tensorflow.framework import tf

MISSING_CONTAINER = "shoal.horovod"
"""The resource container whose variables never exist: reading one is the graph's FailedPrecondition."""


class _AsOpError:
    """Mixin: a ShoalError that is also a ``tf.errors.OpError`` of ``code``."""

    code: int

    def __init__(self, message: str, hint: str = "") -> None:
        ShoalError.__init__(self, message, hint)  # type: ignore[arg-type]
        self._node_def, self._op, self._error_code, self._experimental_payloads = None, None, self.code, {}

    @property
    def message(self) -> str:  # OpError's is read-only; ShoalError sets it
        return self._message

    @message.setter
    def message(self, value: str) -> None:
        self._message = value

    def __str__(self) -> str:
        return self._message


class FailedPrecondition(_AsOpError, HorovodMismatchError, tf.errors.FailedPreconditionError):
    """Ranks submitted collectives that disagree: Horovod's ``FailedPreconditionError``."""

    code = tf.errors.FAILED_PRECONDITION


class InvalidArgument(_AsOpError, HorovodUsageError, tf.errors.InvalidArgumentError):
    """Bad input to a collective (e.g. alltoall splits): Horovod's ``InvalidArgumentError``."""

    code = tf.errors.INVALID_ARGUMENT


def as_tf_error(error: ShoalError) -> ShoalError:
    """``error`` as the TF class Horovod's op raises in its place (itself when there is none)."""
    if isinstance(error, HorovodMismatchError) and not isinstance(error, FailedPrecondition):
        return FailedPrecondition(error.message, error.hint)
    if type(error) is HorovodUsageError:
        return InvalidArgument(error.message, error.hint)
    return error


def failing_read(handle: Any) -> Any:
    """A graph op that reads ``handle`` (a variable of :data:`MISSING_CONTAINER`): it fails with
    FailedPrecondition, the variable's name (the message) in its text."""
    return tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.int8)


def missing_handle(message: str) -> Any:
    """An eager resource handle to a variable that does not exist, named ``message``."""
    return tf.raw_ops.VarHandleOp(dtype=tf.int8, shape=[], shared_name=message, container=MISSING_CONTAINER)
