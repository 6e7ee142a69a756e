"""The names every Horovod facade offers as the same objects, imported and listed once.

``shoal.horovod`` (``horovod.torch``), ``shoal.horovod.tensorflow`` and
``shoal.horovod.tensorflow.keras`` share the job's shape, the build queries, the reduction ops,
``HorovodInternalError`` and the timeline's stubs: each facade takes them with ``from
shoal.horovod.common import *`` and adds this ``__all__`` to its own.
"""

from __future__ import annotations

from shoal.horovod.errors import HorovodInternalError
from shoal.horovod.ops import Adasum, Average, Max, Min, Product, Sum
from shoal.horovod.state import (
    cross_rank,
    cross_size,
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
)
from shoal.horovod.unsupported import start_timeline, stop_timeline

__all__ = [
    "Adasum",
    "Average",
    "HorovodInternalError",
    "Max",
    "Min",
    "Product",
    "Sum",
    "cross_rank",
    "cross_size",
    "gloo_built",
    "gloo_enabled",
    "init",
    "is_homogeneous",
    "is_initialized",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "rank",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
]
