"""PMI launchers: MPICH and Intel MPI (Hydra's ``mpiexec``), Cray PALS, and others speaking PMI.

Matches when PMI_RANK and PMI_SIZE are set (Open MPI is tried first, so its ranks never land here).
Local rank and size: MPI_LOCALRANKID / MPI_LOCALNRANKS (Hydra), else PALS_LOCAL_RANKID /
PALS_LOCAL_SIZE (Cray PALS), else the job is assumed to be on one node (local rank = rank), which
the ``reason`` says. Node rank: PALS_NODEID if set, else ``rank // local_size``.

Main address and port follow the Open MPI rules: MASTER_ADDR, else 127.0.0.1 when all ranks are on
this node, else an error; MASTER_PORT, else 29500.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shoal.env.base import (
    DEFAULT_MAIN_PORT,
    EnvInfo,
    LaunchEnvironment,
    check_below,
    has_all,
    read_int,
    read_local_rank,
    read_port,
    read_rank,
    require,
    seen,
)
from shoal.env.openmpi import mpi_main_address

_ADDRESS_HINT = (
    "mpiexec -genv MASTER_ADDR <head node address> -genv MASTER_PORT 29500 ... (or launch with `shoal`, which sets it)"
)
# (local rank, local size) variable pairs, most specific first.
_LOCAL = (("MPI_LOCALRANKID", "MPI_LOCALNRANKS"), ("PALS_LOCAL_RANKID", "PALS_LOCAL_SIZE"))


class PMIEnvironment(LaunchEnvironment):
    name = "pmi"

    @classmethod
    def detect(cls, environ: Mapping[str, str], *, argv: Sequence[str] | None = None) -> bool:
        return has_all(environ, "PMI_RANK", "PMI_SIZE")

    @classmethod
    def describe(cls, environ: Mapping[str, str], *, argv: Sequence[str] | None = None) -> EnvInfo:
        require(environ, cls.name, "PMI_RANK", "PMI_SIZE", hint="start the processes with `mpiexec -n N ...`")
        rank, world = read_rank(environ, "PMI_RANK", "PMI_SIZE")
        pair = next((names for names in _LOCAL if has_all(environ, *names)), None)
        if pair is None:
            local_rank, local_world = rank, world
            assumption: tuple[str, ...] = ("no MPI_LOCALRANKID or PALS_LOCAL_RANKID: assumed one node",)
        else:
            local_rank, local_world = read_local_rank(environ, *pair, "PMI_SIZE", world)
            assumption = ()
        num_nodes = -(-world // local_world)
        node_rank = read_int(environ, "PALS_NODEID") if "PALS_NODEID" in environ else rank // local_world
        check_below(
            "PALS_NODEID" if "PALS_NODEID" in environ else "PMI_RANK/local size",
            node_rank,
            "PMI_SIZE/local size",
            num_nodes,
        )
        address = mpi_main_address(environ, cls.name, world, local_world, hint=_ADDRESS_HINT)
        return EnvInfo(
            scheme=cls.name, rank=rank, local_rank=local_rank, world_size=world, local_world_size=local_world,
            node_rank=node_rank, num_nodes=num_nodes, main_address=address,
            main_port=read_port(environ, "MASTER_PORT", DEFAULT_MAIN_PORT),
            reason=seen(environ, "PMI_RANK", "PMI_SIZE", *(pair or ()), "PALS_NODEID", "MASTER_ADDR", "MASTER_PORT")
            + assumption,
        )  # fmt: skip
