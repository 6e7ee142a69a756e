"""Horovod's Keras API (``horovod.tensorflow.keras``, Horovod 0.28) for Keras 3 on torch.distributed.

::

    import shoal.horovod.tensorflow.keras as hvd   # instead of: import horovod.tensorflow.keras as hvd

    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
    model.compile(optimizer=opt, loss=...)
    model.fit(dataset.shard(hvd.size(), hvd.rank()), callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
    ], verbose=1 if hvd.rank() == 0 else 0)

``DistributedOptimizer`` takes a Keras 3 optimizer; the collectives take values (numbers, arrays,
tensors). docs/HOROVOD.md ("TensorFlow and Keras") maps the lab's seven steps.
"""

from __future__ import annotations

from shoal.horovod import common as _common
from shoal.horovod import elastic
from shoal.horovod import unsupported as _unsupported
from shoal.horovod.common import *  # noqa: F403
from shoal.horovod.tensorflow import callbacks
from shoal.horovod.tensorflow.compression import Compression
from shoal.horovod.tensorflow.keras_values import allgather, allreduce, broadcast, reducescatter
from shoal.horovod.tensorflow.optimizer import DistributedOptimizer
from shoal.horovod.tensorflow.saving import load_model
from shoal.horovod.tensorflow.variables import (
    allgather_object,
    broadcast_global_variables,
    broadcast_object,
    broadcast_variables,
)

__all__ = [
    "Compression",
    "DistributedOptimizer",
    "allgather",
    "allgather_object",
    "allreduce",
    "broadcast",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_variables",
    "callbacks",
    "elastic",
    "load_model",
    "reducescatter",
]
__all__ += _common.__all__  # init, size, rank, Average, Sum...: the names every facade shares

__getattr__ = _unsupported.facade_getattr  # a Horovod name not offered here: one line naming it
