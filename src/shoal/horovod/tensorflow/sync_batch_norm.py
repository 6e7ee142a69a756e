"""``SyncBatchNormalization``: Keras 3 batch normalization whose batch statistics span every rank.

Horovod's (``horovod/tensorflow/sync_batch_norm.py``, 0.28) subclasses Keras 2's layer and passes
``fused=False``, which Keras 3 no longer accepts. Here the Keras 3 layer's ``_moments`` is replaced:
each rank's element count, sum and sum of squares per channel are summed over the ranks in one
allreduce (differentiable, so the gradients flow across ranks as the statistics do), and the mean
and variance come from those totals: exact also when the ranks' batches differ in size. Without a
mask only; inference uses the moving statistics as the plain layer does.
"""

from __future__ import annotations

from typing import Any

import keras

from shoal.horovod import ops as engine
from shoal.horovod import state
from shoal.horovod.tensorflow.collectives import allreduce
from shoal.horovod.tensorflow.framework import tf


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """``keras.layers.BatchNormalization`` with mean and variance over the global batch (all ranks)."""

    def __init__(self, *args: Any, fused: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # ``fused`` (Keras 2, Horovod passes False) is accepted and ignored

    def _moments(self, inputs: Any, mask: Any) -> Any:
        if mask is not None or state.size() == 1:
            return super()._moments(inputs, mask)
        x = tf.cast(inputs, tf.float32) if inputs.dtype in (tf.float16, tf.bfloat16) else inputs
        axes = list(self._reduction_axes)
        count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), x.dtype)
        local = tf.concat([tf.reshape(count, [1]), tf.reduce_sum(x, axes), tf.reduce_sum(tf.square(x), axes)], axis=0)
        total = allreduce(local, op=engine.Sum, name=f"{self.name}.moments")
        channels = (tf.shape(total)[0] - 1) // 2
        n = total[0]
        mean = total[1 : 1 + channels] / n
        variance = tf.maximum(total[1 + channels :] / n - tf.square(mean), 0.0)
        return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype)
