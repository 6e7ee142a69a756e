"""The contract every launch scheme implements.

A *launch scheme* is whatever started this process: torchrun, ``srun``, ``mpirun``, a Kubeflow pod,
or a plain ``python script.py``. Each scheme is one small subclass of :class:`LaunchEnvironment`:

- ``detect(environ)`` says, without side effects, whether ``environ`` looks like this scheme;
- ``describe(environ)`` reads rank, local rank, world size, node rank and the main address/port
  from ``environ`` and returns a :class:`EnvInfo`; it raises :class:`~shoal.errors.ShoalError` when
  the variables are present but inconsistent.

Neither method writes ``os.environ``: :func:`shoal.env.detect.torch_env_vars` derives the variables
that ``torch.distributed``'s ``env://`` initialisation reads, and the caller decides to export them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Mapping

DEFAULT_MAIN_PORT = 29500


@dataclass(frozen=True)
class EnvInfo:
    """Where this process sits in the job, as read from its launcher's environment variables."""

    scheme: str
    """Name of the launch scheme (``torchrun``, ``slurm``, ``openmpi``, ``pmi``, ``kubeflow``, ``local``)."""
    rank: int
    """Global rank of this process, ``0 <= rank < world_size``."""
    local_rank: int
    """Rank of this process among the processes of its node."""
    world_size: int
    """Number of processes in the job."""
    local_world_size: int
    """Number of processes of this job on this node."""
    node_rank: int
    """Index of this node, ``0 <= node_rank < num_nodes``."""
    num_nodes: int
    """Number of nodes in the job."""
    main_address: str
    """Address of the rank-0 host, where the rendezvous store listens."""
    main_port: int
    """Port of the rendezvous store on ``main_address``."""
    reason: tuple[str, ...] = field(default=())
    """The variables (``NAME=value``) that made this scheme match, for ``shoal env``."""

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside world size {self.world_size}")
        if not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(f"local rank {self.local_rank} is outside local world size {self.local_world_size}")

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


class LaunchEnvironment:
    """One launch scheme. Subclasses set ``name`` and implement both class methods."""

    name: ClassVar[str] = ""

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:  # pragma: no cover - contract
        """True if ``environ`` was set by this scheme. Must not modify anything."""
        raise NotImplementedError

    @classmethod
    def describe(cls, environ: Mapping[str, str]) -> EnvInfo:  # pragma: no cover - contract
        """This process's place in the job, read from ``environ``."""
        raise NotImplementedError
