"""``DistributedOptimizer`` for Keras 3 optimizers (Horovod's ``horovod/tensorflow/keras/__init__.py``, 0.28).

Horovod 0.28 wraps Keras 2's optimizers (``get_gradients``, ``_aggregate_gradients``, legacy
optimizers, ``var.ref()``) and fails on Keras 3 (horovod/horovod#4290). Keras 3 computes an update
in ``BaseOptimizer._backend_apply_gradients``: clip the gradients, apply weight decay, update
(keras/src/optimizers/base_optimizer.py, Keras 3.15). The distributed optimizer all-reduces the
gradients where they enter that update, in ``_clip_gradients``, so what Keras does after (clipping,
weight decay, loss scaling, EMA) sees the combined gradients, as with Horovod.

``backward_passes_per_step=K`` is Keras 3's own ``gradient_accumulation_steps=K``: K steps
accumulate locally and the K-th step's update reduces and applies them, one all-reduce per K
steps. Keras averages the K gradients; Horovod sums them unless ``average_aggregated_gradients``,
so the reduction is scaled by K to keep Horovod's meaning.

The wrapped optimizer is the same object, its class swapped for a subclass of its own (so
``isinstance`` holds, its state and hyper-parameters are kept, and a saved model names the
original class: ``keras.models.load_model`` reads it without shoal).
"""

from __future__ import annotations

from typing import Any

import keras

from shoal.horovod import state, unsupported
from shoal.horovod.errors import HorovodUsageError
from shoal.horovod.tensorflow.compression import Compression
from shoal.horovod.tensorflow.reduce import GradientSettings, reduce_gradients, settings_for


class _DistributedMixin:
    """Combines the gradients of all ranks before Keras clips and applies them."""

    _hvd_settings: GradientSettings
    _hvd_scale: float

    def _clip_gradients(self, grads: list[Any]) -> list[Any]:
        grads = reduce_gradients(list(grads), self._hvd_settings, self._hvd_scale)
        return super()._clip_gradients(grads)  # type: ignore[misc]


_CLASSES: dict[type, type] = {}


def _distributed_class(base: type) -> type:
    if base not in _CLASSES:
        cls = type(base.__name__, (_DistributedMixin, base), {})
        cls.__module__, cls.__qualname__ = base.__module__, base.__qualname__  # saved models name the base
        _CLASSES[base] = cls
    return _CLASSES[base]


def is_distributed(optimizer: Any) -> bool:
    return isinstance(optimizer, _DistributedMixin)


def DistributedOptimizer(  # Horovod's name: a function that returns an optimizer
    optimizer: Any,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: Any = None,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: Any = None,
    process_set: Any = state.global_process_set,
    scale_local_gradients: bool = True,
) -> Any:
    """``optimizer`` (a Keras 3 optimizer), now combining every rank's gradients before each update.

    ``op`` defaults to Average. ``num_groups``/``groups`` are accepted: all dense gradients of one
    dtype already travel in one buffer. ``name``, ``device_*`` have no effect.
    """
    state.job("DistributedOptimizer()")
    state.check_process_set(process_set, "DistributedOptimizer")
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise HorovodUsageError(
            f"hvd.DistributedOptimizer: {type(optimizer).__name__} is not a Keras 3 optimizer",
            "pass a keras.optimizers optimizer (e.g. keras.optimizers.SGD(...)); Keras 2 / tf.compat.v1 "
            "optimizers do not exist in Keras 3",
        )
    if is_distributed(optimizer):
        raise HorovodUsageError(
            "hvd.DistributedOptimizer: this optimizer is already distributed", "wrap the optimizer once"
        )
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise HorovodUsageError(
            f"hvd.DistributedOptimizer: backward_passes_per_step={backward_passes_per_step!r} must be an integer >= 1",
            "pass 1 (every step) or the number of steps to accumulate",
        )
    if op is not None and int(op) == 2:  # Adasum
        raise unsupported.adasum("hvd.DistributedOptimizer(op=hvd.Adasum)")
    settings = settings_for(op, compression, sparse_as_dense, gradient_predivide_factor, "DistributedOptimizer()")
    if backward_passes_per_step > 1:
        if optimizer.built or optimizer.gradient_accumulation_steps:
            raise HorovodUsageError(
                "hvd.DistributedOptimizer: backward_passes_per_step needs a fresh optimizer without "
                "gradient_accumulation_steps",
                "wrap the optimizer before compile()/fit(), and pass the steps only to hvd.DistributedOptimizer",
            )
        optimizer.gradient_accumulation_steps = backward_passes_per_step
    optimizer.__class__ = _distributed_class(type(optimizer))
    optimizer._hvd_settings = settings
    optimizer._hvd_scale = 1.0 if average_aggregated_gradients else float(backward_passes_per_step)
    return optimizer
