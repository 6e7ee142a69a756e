"""Kubeflow PyTorchJob / Run:ai pods: one process per pod."""

from __future__ import annotations

import pytest

from shoal.env.kubeflow import KubeflowEnvironment
from shoal.errors import ShoalError

# What the training operator gives worker-1 of a PyTorchJob with 1 master + 2 workers.
POD = {
    "MASTER_ADDR": "job-master-0",
    "MASTER_PORT": "23456",
    "RANK": "2",
    "WORLD_SIZE": "3",
    "PYTHONUNBUFFERED": "0",
}


def test_pytorchjob_pod():
    assert KubeflowEnvironment.detect(POD)
    info = KubeflowEnvironment.describe(POD)
    assert (info.scheme, info.rank, info.world_size, info.local_rank, info.local_world_size) == ("kubeflow", 2, 3, 0, 1)
    assert (info.node_rank, info.num_nodes, info.main_address, info.main_port) == (2, 3, "job-master-0", 23456)
    assert info.reason == ("MASTER_ADDR=job-master-0", "MASTER_PORT=23456", "RANK=2", "WORLD_SIZE=3")


def test_local_rank_means_not_kubeflow():
    assert not KubeflowEnvironment.detect(POD | {"LOCAL_RANK": "0"})


def test_pet_variables_for_plain_python():
    pet = {
        "PET_NODE_RANK": "1",
        "PET_NNODES": "2",
        "PET_MASTER_ADDR": "m",
        "PET_MASTER_PORT": "29400",
        "PET_NPROC_PER_NODE": "1",
    }
    assert KubeflowEnvironment.detect(pet)
    info = KubeflowEnvironment.describe(pet)
    assert (info.rank, info.world_size, info.main_address, info.main_port) == (1, 2, "m", 29400)


def test_pet_elastic_range_needs_torchrun():
    pet = {"PET_NODE_RANK": "0", "PET_NNODES": "1:4", "PET_MASTER_ADDR": "m", "PET_MASTER_PORT": "1"}
    with pytest.raises(ShoalError, match="PET_NNODES='1:4' is an elastic range") as err:
        KubeflowEnvironment.describe(pet)
    assert "torchrun" in err.value.hint


def test_several_processes_per_pod_need_torchrun():
    # nprocPerNode: 4 makes WORLD_SIZE count processes while RANK counts pods
    with pytest.raises(ShoalError, match="PET_NPROC_PER_NODE=4") as err:
        KubeflowEnvironment.describe(POD | {"WORLD_SIZE": "12", "PET_NPROC_PER_NODE": "4"})
    assert "torchrun" in err.value.hint
    # "auto" and 1 are one process per pod
    assert KubeflowEnvironment.describe(POD | {"PET_NPROC_PER_NODE": "auto"}).world_size == 3


def test_bad_values_and_missing_variables():
    with pytest.raises(ShoalError, match="RANK=3 is not below WORLD_SIZE=3"):
        KubeflowEnvironment.describe(POD | {"RANK": "3"})
    with pytest.raises(ShoalError, match="MASTER_PORT='http' is not an integer"):
        KubeflowEnvironment.describe(POD | {"MASTER_PORT": "http"})
    with pytest.raises(ShoalError, match="kubeflow: MASTER_PORT, WORLD_SIZE not set") as err:
        KubeflowEnvironment.describe({"MASTER_ADDR": "m", "RANK": "0"})
    assert "PyTorchJob" in err.value.hint
