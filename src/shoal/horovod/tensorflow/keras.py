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

from shoal.horovod import (
    Adasum,
    Average,
    HorovodInternalError,
    Max,
    Min,
    Product,
    Sum,
    cross_rank,
    cross_size,
    elastic,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from shoal.integrations.horovod import unsupported as _unsupported
from shoal.integrations.horovod.tensorflow import callbacks
from shoal.integrations.horovod.tensorflow.compression import Compression
from shoal.integrations.horovod.tensorflow.keras_values import allgather, allreduce, broadcast, reducescatter
from shoal.integrations.horovod.tensorflow.optimizer import DistributedOptimizer
from shoal.integrations.horovod.tensorflow.saving import load_model
from shoal.integrations.horovod.tensorflow.variables import (
    allgather_object,
    broadcast_global_variables,
    broadcast_object,
    broadcast_variables,
)

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "HorovodInternalError",
    "Max",
    "Min",
    "Product",
    "Sum",
    "allgather",
    "allgather_object",
    "allreduce",
    "broadcast",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_variables",
    "callbacks",
    "cross_rank",
    "cross_size",
    "elastic",
    "gloo_built",
    "gloo_enabled",
    "init",
    "is_homogeneous",
    "is_initialized",
    "load_model",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "rank",
    "reducescatter",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
]

__getattr__ = _unsupported.facade_getattr  # a Horovod name not offered here: one line naming it
