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
"""

from __future__ import annotations

from shoal.integrations.horovod import unsupported as _unsupported
from shoal.integrations.horovod.compression import Compression, Compressor, FP16Compressor, NoneCompressor
from shoal.integrations.horovod.errors import HorovodInternalError, install_excepthook
from shoal.integrations.horovod.exchange import (
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
from shoal.integrations.horovod.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from shoal.integrations.horovod.grouped import (
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    sparse_allreduce_async,
)
from shoal.integrations.horovod.join import join
from shoal.integrations.horovod.ops import (
    Adasum,
    Average,
    Handle,
    Max,
    Min,
    Product,
    ReduceOp,
    Sum,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    poll,
    synchronize,
)
from shoal.integrations.horovod.optimizer import DistributedOptimizer
from shoal.integrations.horovod.scatter import (
    grouped_reducescatter,
    grouped_reducescatter_async,
    reducescatter,
    reducescatter_async,
)
from shoal.integrations.horovod.state import (
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
)
from shoal.integrations.horovod.unsupported import elastic, start_timeline, stop_timeline

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "Compressor",
    "DistributedOptimizer",
    "FP16Compressor",
    "Handle",
    "HorovodInternalError",
    "Max",
    "Min",
    "NoneCompressor",
    "Product",
    "ReduceOp",
    "Sum",
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
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "rank",
    "reducescatter",
    "reducescatter_async",
    "rocm_built",
    "shutdown",
    "size",
    "sparse_allreduce_async",
    "start_timeline",
    "stop_timeline",
    "synchronize",
]

__getattr__ = _unsupported.facade_getattr  # a Horovod name not offered here: one line naming it


install_excepthook()
