"""``DistributedGradientTape``: a ``tf.GradientTape`` whose ``gradient()`` is combined over all ranks.

As Horovod's (``horovod/tensorflow/__init__.py``, 0.28): wrap the tape after the forward pass,
``tape.gradient(loss, variables)`` returns every rank's gradients averaged (or reduced with
``op``), through the same fused reduction as the Keras :mod:`.optimizer`. Works eagerly and inside
``tf.function``.
"""

from __future__ import annotations

from typing import Any

from shoal.horovod import state, unsupported
from shoal.horovod.tensorflow.compression import Compression
from shoal.horovod.tensorflow.framework import tf
from shoal.horovod.tensorflow.reduce import GradientSettings, reduce_gradients, settings_for


class _DistributedGradientTape(tf.GradientTape):
    """The wrapped tape's recording, with ``gradient()`` reduced across ranks."""

    def __init__(self, tape: Any, settings: GradientSettings, scale_local_gradients: bool) -> None:
        self.__dict__.update(tape.__dict__)  # share the recording (Horovod copies the tape's state too)
        self._hvd_settings = settings
        self._hvd_local: set[int] = set()
        self._hvd_scale_local = scale_local_gradients

    def register_local_source(self, source: Any) -> None:
        """``source``'s gradient stays this rank's own (divided by ``size()`` unless
        ``scale_local_gradients=False``, as Horovod's): model-parallel parts of a model."""
        self._hvd_local.add(id(source))

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None, **kwargs: Any) -> Any:
        grads = super().gradient(target, sources, output_gradients, **kwargs)
        flat, flat_sources = tf.nest.flatten(grads), tf.nest.flatten(sources)
        local = [id(s) in self._hvd_local for s in flat_sources]
        reduced = iter(reduce_gradients([g for g, mine in zip(flat, local) if not mine], self._hvd_settings))
        out = [_scaled(g, self._hvd_scale_local) if mine else next(reduced) for g, mine in zip(flat, local)]
        return tf.nest.pack_sequence_as(grads, out)


def _scaled(grad: Any, scale: bool) -> Any:
    """A local source's gradient, divided by ``size()`` when ``scale`` (Horovod's pull 3695)."""
    if grad is None or not scale:
        return grad
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / state.size(), grad.indices, grad.dense_shape)
    return grad / state.size()


def DistributedGradientTape(  # Horovod's name
    gradtape: Any,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    op: Any = None,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    process_set: Any = state.global_process_set,
    scale_local_gradients: bool = True,
) -> Any:
    """``gradtape`` whose ``gradient()`` returns the gradients combined over all ranks (Average by default)."""
    state.job("DistributedGradientTape()")
    state.check_process_set(process_set, "DistributedGradientTape")
    if op is not None and int(op) == 2:  # Adasum
        raise unsupported.adasum("hvd.DistributedGradientTape(op=hvd.Adasum)")
    settings = settings_for(op, compression, sparse_as_dense, gradient_predivide_factor, "DistributedGradientTape()")
    return _DistributedGradientTape(gradtape, settings, scale_local_gradients)
