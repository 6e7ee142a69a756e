"""Horovod's TensorFlow 2 API on torch.distributed: change one import, keep the script.

::

    import shoal.horovod.tensorflow as hvd      # instead of: import horovod.tensorflow as hvd

    hvd.init()
    ...
    with tf.GradientTape() as tape:
        loss = loss_fn(model(x), y)
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(optimizer.variables, root_rank=0)

Names, arguments, defaults and exception types follow ``horovod.tensorflow`` (Horovod 0.28),
adapted to Keras 3 where Keras 3 changed. The collectives run on shoal.horovod's engine (gloo on
CPU, NCCL on GPU, the same cross-rank checks); TF tensors cross by DLPack without a copy where
safe. Eager, inside ``tf.function`` and in TF1 graph mode (``tf.py_function`` carries them; not
under XLA). Without TensorFlow installed, importing this module fails with one line and a HINT.
docs/HOROVOD.md ("TensorFlow and Keras") lists the differences.
"""

from __future__ import annotations

from shoal.horovod import (
    Adasum,
    Average,
    HorovodInternalError,
    Max,
    Min,
    Product,
    ReduceOp,
    Sum,
    barrier,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    global_process_set,
    gloo_built,
    gloo_enabled,
    gpu_available,
    init,
    is_homogeneous,
    is_initialized,
    join,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from shoal.integrations.horovod import unsupported as _unsupported
from shoal.integrations.horovod.tensorflow.collectives import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
)
from shoal.integrations.horovod.tensorflow.compression import Compression, Compressor, FP16Compressor, NoneCompressor
from shoal.integrations.horovod.tensorflow.elastic import elastic
from shoal.integrations.horovod.tensorflow.graph import executing_eagerly as _executing_eagerly
from shoal.integrations.horovod.tensorflow.named_ops import local_rank_op, local_size_op, rank_op, size_op
from shoal.integrations.horovod.tensorflow.optimizer import DistributedOptimizer
from shoal.integrations.horovod.tensorflow.sync_batch_norm import SyncBatchNormalization
from shoal.integrations.horovod.tensorflow.tape import DistributedGradientTape
from shoal.integrations.horovod.tensorflow.variables import (
    allgather_object,
    broadcast_,
    broadcast_global_variables,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
)

__all__ = [
    "_executing_eagerly",
    "Adasum",
    "Average",
    "Compression",
    "Compressor",
    "DistributedGradientTape",
    "DistributedOptimizer",
    "FP16Compressor",
    "HorovodInternalError",
    "Max",
    "Min",
    "NoneCompressor",
    "Product",
    "ReduceOp",
    "Sum",
    "SyncBatchNormalization",
    "allgather",
    "allgather_object",
    "allreduce",
    "alltoall",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_object_fn",
    "broadcast_variables",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "elastic",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "gpu_available",
    "grouped_allgather",
    "grouped_allreduce",
    "grouped_reducescatter",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_rank_op",
    "local_size",
    "local_size_op",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "rank",
    "rank_op",
    "reducescatter",
    "rocm_built",
    "shutdown",
    "size",
    "size_op",
    "start_timeline",
    "stop_timeline",
    "util",
]

from shoal.horovod.tensorflow import util  # horovod.tensorflow.util, a submodule Horovod exposes

__getattr__ = _unsupported.facade_getattr  # a Horovod name not offered here: one line naming it
