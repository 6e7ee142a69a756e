"""``hvd.init()``, the job's shape and the build queries, answered from shoal's own view of the job.

``init`` joins the job through :func:`shoal.init` (``shoal.context``), so every launcher shoal
detects works: ``mpirun``, ``srun``, torchrun, ``shoal run``, a Kubeflow pod, or plain ``python``
(one process, no process group). Sizes and ranks come from the detected environment
(``ctx.environment``): ``local_*`` are this node's processes, ``cross_*`` the nodes.

When the job runs on GPUs the default process group is NCCL, which moves only CUDA tensors;
Horovod also reduces CPU tensors (metrics, ``broadcast_object``), so ``init`` then opens a second,
gloo group for CPU tensors and :func:`group_for` routes each tensor to the group that can move it.
"""

from __future__ import annotations

import atexit
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from shoal import context as shoal_context
from shoal.horovod import unsupported
from shoal.horovod.errors import HorovodUnsupported, HorovodUsageError, not_initialized

if TYPE_CHECKING:
    from shoal.context import Context


@dataclass
class _Job:
    """What ``hvd.init()`` set up; gone again after ``hvd.shutdown()``."""

    context: "Context"
    owns_context: bool
    cpu_group: Any = None
    """A gloo group for CPU tensors when the default group is NCCL; None otherwise."""
    optimizers: "weakref.WeakSet[Any]" = field(default_factory=weakref.WeakSet)
    """The live DistributedOptimizers that reduce gradients (``join`` shadows them)."""
    rounds: int = 0
    """Gradient synchronisations this rank took part in (``join`` uses them to order the joins)."""
    active_flag: Any = None
    """The last synchronisation's count of active ranks, as a tensor not yet read (see peers_joined)."""
    joined_seen: bool = False
    pending: dict[str, Any] = field(default_factory=dict)
    """Named async ops' handles not yet waited for, by name: the name stays taken until its op is
    synchronized, even if the handle is dropped (dropping it does not end the op; Horovod's
    DUPLICATE_NAME_ERROR). Gone with the job."""

    def peers_joined(self) -> bool:
        """True once a gradient synchronisation showed that another rank had called ``join()``."""
        if self.active_flag is not None:
            if round(float(self.active_flag.item())) < self.context.world_size:
                self.joined_seen = True
            self.active_flag = None
        return self.joined_seen


_job: _Job | None = None


class _GlobalProcessSet:
    """Horovod's ``global_process_set``: every rank. The only process set shoal offers."""

    def __repr__(self) -> str:
        return "ProcessSet(process_set_id=0, ranks=all)"

    def included(self) -> bool:
        return True

    def size(self) -> int:
        return size()

    def rank(self) -> int:
        return rank()


global_process_set = _GlobalProcessSet()


def check_process_set(process_set: Any, call: str) -> None:
    """Only the global process set exists here; any other is a HorovodUnsupported naming the call."""
    if process_set is not None and process_set is not global_process_set:
        raise unsupported.process_sets(f"hvd.{call}(process_set=...)")


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Join the job (``shoal.init()``): every launcher shoal detects works, or plain python (size 1).

    ``comm`` (an MPI communicator or a list of ranks) and ``process_sets`` are Horovod's ways of
    running on a subset of the ranks; shoal always uses every rank, so only the whole job is
    accepted. Horovod settings in the environment that shoal does not act on (``HOROVOD_TIMELINE``,
    ``HOROVOD_CYCLE_TIME``, ...) are named in one warning line (rank 0) and ignored. Calling
    ``init`` again does nothing.
    """
    global _job
    if _job is not None:
        return
    if process_sets not in (None, []):
        raise unsupported.process_sets("hvd.init(process_sets=...)")
    had_context = shoal_context.current() is not None
    ctx = shoal_context.init()
    if comm not in (None, []) and not (isinstance(comm, (list, tuple)) and list(comm) == list(range(ctx.world_size))):
        if not had_context:
            ctx.shutdown()
        raise HorovodUnsupported(
            "hvd.init(comm=...) with a subset of the ranks or an MPI communicator is not supported",
            "start only the processes you need (every process shoal.horovod sees is in the job), "
            "or build a subgroup with torch.distributed.new_group(ranks)",
        )
    cpu_group = None
    if ctx.world_size > 1 and dist.get_backend() == "nccl":
        cpu_group = dist.new_group(backend="gloo")
    _job = _Job(context=ctx, owns_context=not had_context, cpu_group=cpu_group)
    if ctx.rank == 0:  # one line for the job, not one per rank
        unsupported.warn_ignored_settings(unsupported.ignored_settings())
    # Horovod shuts down at exit; leaving the process group before the interpreter goes away also
    # avoids the gloo abort at exit that shoal.distributed.process_group.destroy_process_group notes.
    atexit.register(shutdown)


def shutdown() -> None:
    """Leave the job: the process group closes if ``hvd.init()`` opened it. Safe to call twice."""
    global _job
    job, _job = _job, None
    if job is None:
        return
    if job.cpu_group is not None and dist.is_initialized():
        dist.destroy_process_group(job.cpu_group)
    if job.owns_context:
        job.context.shutdown()


def is_initialized() -> bool:
    return _job is not None


def job(call: str) -> _Job:
    """The state made by ``hvd.init()``; a HorovodUsageError naming ``hvd.<call>`` before it."""
    if _job is None:
        raise not_initialized(call)
    return _job


def size() -> int:
    """The number of processes in the job."""
    return job("size()").context.world_size


def rank() -> int:
    """This process's rank in the job, ``0 <= rank < size()``."""
    return job("rank()").context.rank


def local_size() -> int:
    """The number of processes of this job on this node."""
    return job("local_size()").context.local_world_size


def local_rank() -> int:
    """This process's rank among the processes of its node: the GPU to pin."""
    return job("local_rank()").context.local_rank


def cross_size() -> int:
    """The number of nodes (Horovod: the processes with this local rank, one per node)."""
    return job("cross_size()").context.num_nodes


def cross_rank() -> int:
    """The index of this node (Horovod: this process's rank among those with its local rank)."""
    return job("cross_rank()").context.node_rank


def is_homogeneous() -> bool:
    """True when every node runs the same number of processes."""
    ctx = job("is_homogeneous()").context
    return ctx.local_world_size * ctx.num_nodes == ctx.world_size


def group_for(tensor: torch.Tensor) -> Any:
    """The process group that can move ``tensor``: gloo for CPU tensors under NCCL, else the default."""
    current = _job
    if current is not None and current.cpu_group is not None and tensor.device.type == "cpu":
        return current.cpu_group
    return None


def object_group() -> Any:
    """The group for pickled objects: gloo (CPU) whenever there is one, so nothing lands on a GPU."""
    current = _job
    return current.cpu_group if current is not None else None


# ---- build and runtime queries, answered for shoal's engine (torch.distributed) -----------------


def mpi_built() -> bool:
    """False: shoal moves tensors with torch.distributed (gloo, NCCL), never through MPI.

    ``mpirun`` only starts the processes; their ranks come from its environment variables.
    """
    return False


def mpi_enabled() -> bool:
    """False: no collective runs over MPI (see :func:`mpi_built`)."""
    return False


def mpi_threads_supported() -> bool:
    """False: shoal does not run MPI, so it makes no promise about mixing with MPI libraries.

    (Horovod raises ValueError when its MPI is not enabled; False keeps the common
    ``if hvd.mpi_threads_supported(): ...mpi4py...`` guard working.)
    """
    job("mpi_threads_supported()")
    return False


def gloo_built() -> bool:
    """Whether this torch build has the gloo backend."""
    return dist.is_available() and dist.is_gloo_available()


def gloo_enabled() -> bool:
    """Whether this job moves tensors with gloo (the CPU backend, or the CPU group beside NCCL)."""
    current = _job
    return current is not None and (current.context.backend == "gloo" or current.cpu_group is not None)


def nccl_built() -> int:
    """NCCL's version code (e.g. 23007 for 2.30.7) when this torch build has NCCL, else 0 (as Horovod)."""
    if not (dist.is_available() and dist.is_nccl_available()):
        return 0
    try:
        major, minor, patch = torch.cuda.nccl.version()[:3]
    except (RuntimeError, AttributeError, TypeError, ValueError):
        return 0
    # NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch since NCCL 2.9, major * 1000 + ... before.
    return major * 10000 + minor * 100 + patch if (major, minor) >= (2, 9) else major * 1000 + minor * 100 + patch


def cuda_built() -> bool:
    """Whether this torch build has CUDA."""
    return torch.backends.cuda.is_built() and torch.version.cuda is not None


def rocm_built() -> bool:
    """Whether this torch build is for ROCm."""
    return getattr(torch.version, "hip", None) is not None


def ddl_built() -> bool:
    """False: IBM DDL is not a torch.distributed backend."""
    return False


def ccl_built() -> bool:
    """False: shoal does not use oneCCL."""
    return False


def gpu_available(ext_base_name: str = "torch", verbose: bool = False) -> bool:
    """Whether a CUDA GPU is usable from this process (Horovod's ``horovod.common.util.gpu_available``)."""
    if ext_base_name not in ("torch", "pytorch"):
        raise HorovodUsageError(
            f"gpu_available({ext_base_name!r}): shoal.horovod answers for torch only",
            "call hvd.gpu_available() or hvd.gpu_available('torch')",
        )
    return torch.cuda.is_available()
