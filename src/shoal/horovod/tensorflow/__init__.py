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

The implementation, private modules beside this facade, by concept:

- :mod:`~.framework`: TensorFlow itself (one line and a HINT when it is missing).
- :mod:`~.bridge`: TF tensors to torch and back by DLPack, copied where sharing is unsafe.
- :mod:`~.graph`: a torch-side collective run eagerly, or as a ``tf.py_function`` in graphs.
- :mod:`~.collectives`: ``allreduce``, ``allgather``, ``broadcast``, ``alltoall``, ``reducescatter``
  and their grouped forms, with Horovod's gradients.
- :mod:`~.variables`: ``broadcast_variables``, ``broadcast_object``, ``allgather_object``.
- :mod:`~.compression`: ``Compression.none`` / ``Compression.fp16`` on TF tensors.
- :mod:`~.reduce`: one step's gradients fused and all-reduced (the optimizer's and the tape's core).
- :mod:`~.optimizer`: ``DistributedOptimizer`` for Keras 3 optimizers.
- :mod:`~.tape`: ``DistributedGradientTape``.
- :mod:`~.callbacks`: Horovod's Keras callbacks.
- :mod:`~.saving`: ``load_model``.
- :mod:`~.keras`: the ``horovod.tensorflow.keras`` facade; :mod:`~.util`: ``horovod.tensorflow.util``.
"""

from __future__ import annotations

from shoal.horovod import (
    ReduceOp,
    barrier,
    ccl_built,
    cuda_built,
    ddl_built,
    global_process_set,
    gpu_available,
    join,
    rocm_built,
)
from shoal.horovod import common as _common
from shoal.horovod import unsupported as _unsupported
from shoal.horovod.common import *  # noqa: F403

# The first module of this package imported, before any imports keras: without TensorFlow, one line and a HINT.
from shoal.horovod.tensorflow import framework as _framework  # noqa: F401
from shoal.horovod.tensorflow import util  # horovod.tensorflow.util, a submodule Horovod exposes
from shoal.horovod.tensorflow.collectives import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
)
from shoal.horovod.tensorflow.compression import Compression, Compressor, FP16Compressor, NoneCompressor
from shoal.horovod.tensorflow.elastic import elastic
from shoal.horovod.tensorflow.graph import executing_eagerly as _executing_eagerly
from shoal.horovod.tensorflow.named_ops import local_rank_op, local_size_op, rank_op, size_op
from shoal.horovod.tensorflow.optimizer import DistributedOptimizer
from shoal.horovod.tensorflow.sync_batch_norm import SyncBatchNormalization
from shoal.horovod.tensorflow.tape import DistributedGradientTape
from shoal.horovod.tensorflow.variables import (
    allgather_object,
    broadcast_,
    broadcast_global_variables,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
)

__all__ = [
    "_executing_eagerly",
    "Compression",
    "Compressor",
    "DistributedGradientTape",
    "DistributedOptimizer",
    "FP16Compressor",
    "NoneCompressor",
    "ReduceOp",
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
    "cuda_built",
    "ddl_built",
    "elastic",
    "global_process_set",
    "gpu_available",
    "grouped_allgather",
    "grouped_allreduce",
    "grouped_reducescatter",
    "join",
    "local_rank_op",
    "local_size_op",
    "rank_op",
    "reducescatter",
    "rocm_built",
    "size_op",
    "util",
]
__all__ += _common.__all__  # init, size, rank, Average, Sum...: the names every facade shares

__getattr__ = _unsupported.facade_getattr  # a Horovod name not offered here: one line naming it
