"""Open MPI's mpirun and PMI launchers (MPICH / Intel MPI Hydra, Cray PALS)."""

from __future__ import annotations

import pytest

from shoal.env.openmpi import OpenMPIEnvironment
from shoal.env.pmi import PMIEnvironment
from shoal.errors import ShoalError


def ompi(rank: int, size: int, local_rank: int, local_size: int, **extra: str) -> dict[str, str]:
    return {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
        **extra,
    }


def test_openmpi_single_node_defaults_to_loopback():
    env = ompi(1, 2, 1, 2)
    assert OpenMPIEnvironment.detect(env)
    info = OpenMPIEnvironment.describe(env)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (1, 2, 1, 2)
    assert (info.node_rank, info.num_nodes) == (0, 1)
    assert (info.main_address, info.main_port) == ("127.0.0.1", 29500)


def test_openmpi_multi_node_needs_master_addr():
    env = ompi(5, 8, 1, 4)
    with pytest.raises(ShoalError, match="MASTER_ADDR is needed") as err:
        OpenMPIEnvironment.describe(env)
    assert err.value.hint.startswith("mpirun -x MASTER_ADDR=<head node address> -x MASTER_PORT=29500")
    info = OpenMPIEnvironment.describe(env | {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "23000"})
    assert (info.main_address, info.main_port, info.node_rank, info.num_nodes) == ("10.0.0.1", 23000, 1, 2)


def test_openmpi_node_rank_ignores_ompi_node_rank():
    # OMPI_COMM_WORLD_NODE_RANK is a per-node process rank across jobs, not the node's index.
    env = ompi(6, 8, 2, 4, OMPI_COMM_WORLD_NODE_RANK="2", MASTER_ADDR="h")
    assert OpenMPIEnvironment.describe(env).node_rank == 1


@pytest.mark.parametrize(
    "env, message",
    [
        (ompi(2, 2, 0, 2), "OMPI_COMM_WORLD_RANK=2 is not below OMPI_COMM_WORLD_SIZE=2"),
        (ompi(0, 2, 2, 2), "OMPI_COMM_WORLD_LOCAL_RANK=2 is not below OMPI_COMM_WORLD_LOCAL_SIZE=2"),
        (ompi(0, 2, 0, 3), "OMPI_COMM_WORLD_LOCAL_SIZE=3 is above OMPI_COMM_WORLD_SIZE=2"),
        (ompi(0, 2, 0, 2) | {"OMPI_COMM_WORLD_RANK": "x"}, "OMPI_COMM_WORLD_RANK='x' is not an integer"),
        (
            {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"},
            "openmpi: OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE not set",
        ),
    ],
)
def test_openmpi_bad_values(env, message):
    with pytest.raises(ShoalError, match=message) as err:
        OpenMPIEnvironment.describe(env)
    assert err.value.hint


def test_pmi_hydra():
    env = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "MASTER_ADDR": "h0"}
    assert PMIEnvironment.detect(env)
    info = PMIEnvironment.describe(env)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (3, 4, 1, 2)
    assert (info.node_rank, info.num_nodes, info.main_address) == (1, 2, "h0")


def test_pmi_pals_uses_its_node_id():
    env = {
        "PMI_RANK": "3",
        "PMI_SIZE": "6",
        "PALS_LOCAL_RANKID": "0",
        "PALS_LOCAL_SIZE": "3",
        "PALS_NODEID": "1",
        "MASTER_ADDR": "x1000c0s0b0n0",
    }
    info = PMIEnvironment.describe(env)
    assert (info.local_rank, info.local_world_size, info.node_rank, info.num_nodes) == (0, 3, 1, 2)


def test_pmi_without_local_variables_assumes_one_node():
    info = PMIEnvironment.describe({"PMI_RANK": "1", "PMI_SIZE": "3"})
    assert (info.local_rank, info.local_world_size, info.num_nodes, info.main_address) == (1, 3, 1, "127.0.0.1")
    assert any("assumed one node" in r for r in info.reason)


def test_pmi_multi_node_needs_master_addr_with_hydra_hint():
    env = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    with pytest.raises(ShoalError, match="pmi: MASTER_ADDR is needed") as err:
        PMIEnvironment.describe(env)
    assert "-genv MASTER_ADDR" in err.value.hint


def test_pmi_bad_values():
    with pytest.raises(ShoalError, match="PMI_RANK=4 is not below PMI_SIZE=4"):
        PMIEnvironment.describe({"PMI_RANK": "4", "PMI_SIZE": "4"})
    with pytest.raises(ShoalError, match="MPI_LOCALRANKID=2 is not below MPI_LOCALNRANKS=2"):
        PMIEnvironment.describe({"PMI_RANK": "0", "PMI_SIZE": "4", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "2"})
    with pytest.raises(ShoalError, match="pmi: PMI_SIZE not set"):
        PMIEnvironment.describe({"PMI_RANK": "0"})
