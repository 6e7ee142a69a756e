"""Open MPI's ``mpirun``/``mpiexec`` (ORTE and PRRTE), which exports OMPI_COMM_WORLD_* to every rank.

Matches when OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE are set. Local rank and size come from
OMPI_COMM_WORLD_LOCAL_RANK / OMPI_COMM_WORLD_LOCAL_SIZE. The node rank is ``rank // local_size``,
exact for mpirun's default by-slot mapping with the same number of ranks per node; it is not read
from OMPI_COMM_WORLD_NODE_RANK, which despite its name is this process's rank among *all* jobs'
processes on its node, not the index of the node.

Open MPI exports no address for rank 0's host. MASTER_ADDR is used if set; when every rank is on
this node (LOCAL_SIZE == SIZE) it defaults to 127.0.0.1; otherwise it is an error whose hint says
how to pass it (``shoal``'s own launcher does). Port: MASTER_PORT, else 29500.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shoal.env.base import (
    DEFAULT_MAIN_PORT,
    LOOPBACK,
    EnvInfo,
    LaunchEnvironment,
    has_all,
    read_local_rank,
    read_port,
    read_rank,
    require,
    seen,
)
from shoal.errors import ShoalError

_ADDRESS_HINT = (
    "mpirun -x MASTER_ADDR=<head node address> -x MASTER_PORT=29500 ... (or launch with `shoal`, which sets it)"
)
_RANK, _SIZE = "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"
_LOCAL_RANK, _LOCAL_SIZE = "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"


def mpi_main_address(environ: Mapping[str, str], scheme: str, world: int, local_world: int, hint: str) -> str:
    """MASTER_ADDR, else 127.0.0.1 when the whole job is on this node, else ShoalError with ``hint``."""
    if "MASTER_ADDR" in environ:
        return environ["MASTER_ADDR"]
    if local_world == world:
        return LOOPBACK
    raise ShoalError(
        f"{scheme}: MASTER_ADDR is needed: {world} ranks run on several nodes ({local_world} on this one) "
        "and the MPI launcher does not say where rank 0 is",
        hint,
    )


def mpirun_run_id(environ: Mapping[str, str]) -> str | None:
    """``mpirun-JOBID`` for the Open MPI job this process belongs to, or None outside one."""
    if "OMPI_MCA_ess_base_jobid" not in environ:
        return None
    return f"mpirun-{environ['OMPI_MCA_ess_base_jobid']}"


class OpenMPIEnvironment(LaunchEnvironment):
    name = "openmpi"

    @classmethod
    def detect(cls, environ: Mapping[str, str], *, argv: Sequence[str] | None = None) -> bool:
        return has_all(environ, _RANK, _SIZE)

    @classmethod
    def describe(cls, environ: Mapping[str, str], *, argv: Sequence[str] | None = None) -> EnvInfo:
        require(
            environ,
            cls.name,
            _RANK,
            _SIZE,
            _LOCAL_RANK,
            _LOCAL_SIZE,
            hint="start the processes with Open MPI's `mpirun -np N ...`",
        )
        rank, world = read_rank(environ, _RANK, _SIZE)
        local_rank, local_world = read_local_rank(environ, _LOCAL_RANK, _LOCAL_SIZE, _SIZE, world)
        address = mpi_main_address(environ, cls.name, world, local_world, hint=_ADDRESS_HINT)
        return EnvInfo(
            scheme=cls.name, rank=rank, local_rank=local_rank, world_size=world, local_world_size=local_world,
            node_rank=rank // local_world, num_nodes=-(-world // local_world), main_address=address,
            main_port=read_port(environ, "MASTER_PORT", DEFAULT_MAIN_PORT),
            reason=seen(environ, _RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE, "MASTER_ADDR", "MASTER_PORT"),
        )  # fmt: skip
