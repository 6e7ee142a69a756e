"""The contract every launch scheme implements, and the small readers they share.

A *launch scheme* is whatever started this process: torchrun, ``srun``, ``mpirun``, a Kubeflow pod,
or a plain ``python script.py``. Each scheme is one small subclass of :class:`LaunchEnvironment`:

- ``detect(environ, argv=...)`` says, without side effects, whether ``environ`` looks like this
  scheme. It never raises for bad values: a scheme that matches and then finds nonsense reports it
  from ``describe``, where the message can name the variable.
- ``describe(environ, argv=...)`` reads rank, local rank, world size, node rank and the main
  address/port from ``environ`` and returns an :class:`EnvInfo`. It raises
  :class:`~shoal.errors.ShoalError` naming the variable when one it needs is missing, is not an
  integer, or contradicts another (``RANK=4`` with ``WORLD_SIZE=4``). ``describe`` is also what a
  forced scheme (``SHOAL_ENV=slurm``) runs without ``detect``, so it must check what it reads.

Both are pure functions of their arguments. Neither writes ``os.environ``:
:func:`shoal.env.detect.torch_env_vars` derives the variables that ``torch.distributed``'s
``env://`` initialisation reads, and the caller decides whether to export them. ``argv`` only matters
to torchrun's legacy launcher (which passes ``--local_rank`` on the command line); ``None`` means
``sys.argv``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from shoal.errors import ShoalError

DEFAULT_MAIN_PORT = 29500
"""torch's default rendezvous port: torchrun's --master-port, the static rendezvous, ``env://``."""
DEFAULT_C10D_PORT = 29400
"""torch's port for a c10d rendezvous endpoint given without one."""
LOOPBACK = "127.0.0.1"


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
        # Schemes raise ShoalError naming the variable first; these guard the invariants themselves.
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside world size {self.world_size}")
        if not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(f"local rank {self.local_rank} is outside local world size {self.local_world_size}")
        if not 0 <= self.node_rank < self.num_nodes:
            raise ValueError(f"node rank {self.node_rank} is outside node count {self.num_nodes}")
        if not 0 < self.main_port < 65536:
            raise ValueError(f"port {self.main_port} is not a TCP port")


class LaunchEnvironment:
    """One launch scheme. Subclasses set ``name`` and implement both class methods."""

    name: ClassVar[str] = ""

    @classmethod
    def detect(cls, environ: Mapping[str, str], *, argv: Sequence[str] | None = None) -> bool:  # pragma: no cover
        """True if ``environ`` was set by this scheme. Must not modify anything, must not raise."""
        raise NotImplementedError

    @classmethod
    def describe(cls, environ: Mapping[str, str], *, argv: Sequence[str] | None = None) -> EnvInfo:  # pragma: no cover
        """This process's place in the job, read from ``environ``; ShoalError if it cannot be."""
        raise NotImplementedError


# ---- readers shared by the schemes: every error names the variable and its value ----------------


def has_all(environ: Mapping[str, str], *names: str) -> bool:
    """True if every one of ``names`` is set (to anything, even empty)."""
    return all(name in environ for name in names)


def first_set(environ: Mapping[str, str], *names: str) -> str | None:
    """The first of ``names`` that is set, or None."""
    return next((name for name in names if name in environ), None)


def require(environ: Mapping[str, str], scheme: str, *names: str, hint: str) -> None:
    """ShoalError naming every one of ``names`` that ``scheme`` needs but is not set."""
    missing = [name for name in names if name not in environ]
    if missing:
        raise ShoalError(f"{scheme}: {', '.join(missing)} not set", hint)


def read_int(environ: Mapping[str, str], name: str, *, minimum: int = 0) -> int:
    """``int(environ[name])``, or ShoalError naming the variable and its value."""
    value = environ[name]
    try:
        number = int(value.strip())
    except ValueError:
        raise ShoalError(
            f"{name}={value!r} is not an integer",
            f"set {name} to a whole number, or unset it (it comes from the launcher)",
        ) from None
    if number < minimum:
        raise ShoalError(f"{name}={value!r} is below {minimum}", f"set {name} to at least {minimum}")
    return number


def check_below(name: str, value: int, limit_name: str, limit: int) -> None:
    """ShoalError unless ``value < limit``: a rank must be smaller than its size."""
    if value >= limit:
        raise ShoalError(
            f"{name}={value} is not below {limit_name}={limit}",
            f"the launcher's variables disagree: each {name} must be in 0..{limit_name}-1; "
            "check that no stale value is exported in your shell or job script",
        )


def check_not_above(name: str, value: int, limit_name: str, limit: int) -> None:
    """ShoalError unless ``value <= limit``: a node cannot hold more processes than the job."""
    if value > limit:
        raise ShoalError(
            f"{name}={value} is above {limit_name}={limit}",
            "the launcher's variables disagree; check that no stale value is exported in your shell or job script",
        )


def read_rank(environ: Mapping[str, str], rank_name: str, size_name: str) -> tuple[int, int]:
    """(rank, size) from two variables: size at least 1, rank in 0..size-1 (ShoalError naming them)."""
    rank = read_int(environ, rank_name)
    size = read_int(environ, size_name, minimum=1)
    check_below(rank_name, rank, size_name, size)
    return rank, size


def read_local_rank(
    environ: Mapping[str, str], rank_name: str, size_name: str, world_name: str, world: int
) -> tuple[int, int]:
    """(local rank, local size): the local size no more than the world's, the local rank below it."""
    local_size = read_int(environ, size_name, minimum=1)
    check_not_above(size_name, local_size, world_name, world)
    local_rank = read_int(environ, rank_name)
    check_below(rank_name, local_rank, size_name, local_size)
    return local_rank, local_size


def read_port(environ: Mapping[str, str], name: str = "MASTER_PORT", default: int = DEFAULT_MAIN_PORT) -> int:
    """The TCP port in ``environ[name]``, ``default`` when unset; ShoalError when not a port."""
    if name not in environ:
        return default
    port = read_int(environ, name, minimum=1)
    if port > 65535:
        raise ShoalError(f"{name}={environ[name]!r} is not a TCP port", f"set {name} to a port in 1..65535")
    return port


def seen(environ: Mapping[str, str], *names: str) -> tuple[str, ...]:
    """``NAME=value`` for each of ``names`` that is set, for :attr:`EnvInfo.reason`."""
    return tuple(f"{name}={environ[name]}" for name in names if name in environ)
