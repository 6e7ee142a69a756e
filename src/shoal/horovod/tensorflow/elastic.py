"""``hvd.elastic`` for TensorFlow: the state objects run; elastic training itself does not.

:class:`TensorFlowState` is Horovod's (``horovod/tensorflow/elastic.py``, 0.28): variables and plain
attributes that ``sync()`` takes from rank 0, ``commit()`` saves and ``restore()`` puts back. What
needs Horovod's elastic driver (``hvd.elastic.run``: workers that join and leave a running job) is
not offered: one line names shoal's equivalent, restarts by torch's elastic agent and a checkpoint.
"""

from __future__ import annotations

from typing import Any

from shoal.horovod import functions, state, unsupported
from shoal.horovod.tensorflow.framework import tf
from shoal.horovod.tensorflow.variables import broadcast_variables


class TensorFlowState:
    """TF variables plus keyword attributes (e.g. ``batch=0, epoch=0``) kept in step across ranks."""

    def __init__(self, variables: Any = None, session: Any = None, **kwargs: Any) -> None:
        self.variables = list(variables if variables is not None else tf.compat.v1.global_variables())
        self.session = session or (None if tf.executing_eagerly() else tf.compat.v1.get_default_session())
        self._bcast_op = None if tf.executing_eagerly() else broadcast_variables(self.variables, root_rank=0)
        self._saved_attrs = dict(kwargs)
        self._set_attrs()
        self._save_values()

    def sync(self) -> None:
        """Every rank takes rank 0's variables and attributes; then saves them as committed."""
        if self._bcast_op is None:
            broadcast_variables(self.variables, root_rank=0)
        else:
            self._session().run(self._bcast_op)
        self._save_values()
        if self._saved_attrs:
            self._saved_attrs = functions.broadcast_object(self._saved_attrs, 0, None, state.global_process_set)
            self._set_attrs()

    def commit(self) -> None:
        """Save the current values and attributes: what ``restore()`` returns to."""
        self.save()

    def save(self) -> None:
        self._save_values()
        self._saved_attrs = {name: getattr(self, name) for name in self._saved_attrs}

    def restore(self) -> None:
        """Put back the last saved variables and attributes."""
        for variable, value in zip(self.variables, self._values):
            if self._bcast_op is None:
                variable.assign(value)
            else:
                variable.load(value, self._session())
        self._set_attrs()

    def _session(self) -> Any:
        return self.session or tf.compat.v1.get_default_session()

    def _save_values(self) -> None:
        if self._bcast_op is None:
            self._values = [v.numpy() for v in self.variables]
        else:
            self._values = self._session().run(self.variables)

    def _set_attrs(self) -> None:
        for name, value in self._saved_attrs.items():
            setattr(self, name, value)


class _Elastic:
    """``hvd.elastic`` for TensorFlow: :class:`TensorFlowState`; every other name fails with shoal's way."""

    TensorFlowState = TensorFlowState

    def __getattr__(self, name: str) -> Any:
        return getattr(unsupported.elastic, name)

    def __repr__(self) -> str:
        return "<hvd.elastic for TensorFlow: TensorFlowState; elastic runs are not supported by shoal.horovod>"


elastic = _Elastic()
