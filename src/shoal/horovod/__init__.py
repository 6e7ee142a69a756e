"""Horovod's PyTorch API on torch.distributed: change one import, keep the script.

::

    import shoal.horovod as hvd          # instead of: import horovod.torch as hvd

    hvd.init()                                            # mpirun, srun, torchrun, shoal run, python
    torch.cuda.set_device(hvd.local_rank())               # when on GPUs
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    ...
    if hvd.rank() == 0:
        torch.save(model.state_dict(), "checkpoint.pt")

Everything here follows ``horovod.torch`` (Horovod 0.28): names, arguments, defaults, and the
exception types, and Horovod's cross-rank checks (ranks whose tensors disagree in shape, dtype,
name or op get the same one-line error, not a hang). What shoal does not offer (Adasum, the
timeline, ``hvd.elastic``, process sets) fails where it is used with one line naming it and shoal's
equivalent; Horovod settings in the environment that shoal ignores are named in one warning at
``init()``. docs/HOROVOD.md maps the tutorial's steps and lists the differences.

Importing this module makes an uncaught :class:`~shoal.errors.ShoalError` print as two lines
(``shoal: error: ...`` and ``HINT: ...``) instead of a traceback.

The implementation, private modules beside this facade, by concept:

- :mod:`~.common`: the names every facade (torch, TensorFlow, Keras) offers alike, listed once.
- :mod:`~.errors`: the errors (ShoalErrors that are also the exception types Horovod raises).
- :mod:`~.state`: ``init``/``shutdown``, the job's shape (``size``, ``rank``, ``local_*``, ``cross_*``)
  and the build queries (``nccl_built``, ``mpi_built``, ...).
- :mod:`~.ops`: the reduction ops (``Average``, ``Sum``, ...), the ``allreduce`` family and the
  handles of async calls (``synchronize``, ``poll``).
- :mod:`~.exchange`: the collectives that move data (``allgather``, ``broadcast``, ``alltoall``, ``barrier``).
- :mod:`~.grouped`: the grouped forms (``grouped_allreduce``, ``grouped_allgather``) and ``sparse_allreduce_async``.
- :mod:`~.scatter`: ``reducescatter`` and ``grouped_reducescatter``.
- :mod:`~.agreement`: Horovod's cross-rank checks before each collective (shape, dtype, name, op,
  duplicate names): the same one-line error on every rank instead of a hang.
- :mod:`~.dtypes`: the dtype a tensor travels in (int16 as int32: gloo and NCCL lack it).
- :mod:`~.functions`: parameters, optimizer state and Python objects across ranks.
- :mod:`~.buckets`: packing many tensors into few flat buffers (one collective per bucket).
- :mod:`~.compression`: ``Compression.none`` / ``Compression.fp16``.
- :mod:`~.reducer`: the gradient buckets' asynchronous all-reduces, started from hooks during backward.
- :mod:`~.sparse_grads`: the optimizer's sparse gradients, gathered as indices and values.
- :mod:`~.optimizer`: ``DistributedOptimizer``: the wrapped optimizer's ``step()`` after the reducer's work.
- :mod:`~.join`: ``join()``: ranks out of data answer the others' all-reduces with zeros until every rank has joined.
- :mod:`~.unsupported`: what shoal cannot offer (Adasum, the timeline, elastic), named with the
  shoal equivalent; the ``HOROVOD_*`` settings it ignores, named in one warning.
- :mod:`~.recipe`: the tutorial's setup in one call, for benchmarks and examples.
- :mod:`~.tensorflow`: the TensorFlow 2 and Keras 3 API on the same engine; :mod:`~.keras`: ``horovod.keras``.
- :mod:`~.shim`: a ``horovod`` package for PYTHONPATH, so that unchanged ``import horovod...`` lines load these.
"""

from __future__ import annotations

from shoal.horovod import common as _common
from shoal.horovod import unsupported as _unsupported
from shoal.horovod.common import *  # noqa: F403
from shoal.horovod.compression import Compression, Compressor, FP16Compressor, NoneCompressor
from shoal.horovod.errors import install_excepthook
from shoal.horovod.exchange import (
    allgather,
    allgather_async,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
)
from shoal.horovod.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from shoal.horovod.grouped import (
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    sparse_allreduce_async,
)
from shoal.horovod.join import join
from shoal.horovod.ops import (
    Handle,
    ReduceOp,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    poll,
    synchronize,
)
from shoal.horovod.optimizer import DistributedOptimizer
from shoal.horovod.scatter import (
    grouped_reducescatter,
    grouped_reducescatter_async,
    reducescatter,
    reducescatter_async,
)
from shoal.horovod.state import ccl_built, cuda_built, ddl_built, global_process_set, gpu_available, rocm_built
from shoal.horovod.unsupported import elastic

__all__ = [
    "Compression",
    "Compressor",
    "DistributedOptimizer",
    "FP16Compressor",
    "Handle",
    "NoneCompressor",
    "ReduceOp",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "ccl_built",
    "cuda_built",
    "ddl_built",
    "elastic",
    "global_process_set",
    "gpu_available",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "join",
    "poll",
    "reducescatter",
    "reducescatter_async",
    "rocm_built",
    "sparse_allreduce_async",
    "synchronize",
]
__all__ += _common.__all__  # init, size, rank, Average, Sum...: the names every facade shares

__getattr__ = _unsupported.facade_getattr  # a Horovod name not offered here: one line naming it


install_excepthook()
