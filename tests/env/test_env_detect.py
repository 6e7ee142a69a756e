"""The ordered scheme list, forcing a scheme, and the variables handed to torch."""

from __future__ import annotations

import os
import sys
from unittest import mock

import pytest

from shoal.env import SCHEMES, EnvInfo, detect_environment, torch_env_vars
from shoal.errors import ShoalError

SLURM_STEP = {
    "SLURM_JOB_ID": "777",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "1",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "0",
    "SLURM_STEP_NUM_NODES": "1",
    "SLURM_STEP_TASKS_PER_NODE": "2",
    "SLURM_STEP_NODELIST": "node07",
    "SLURM_NTASKS": "2",
}
SBATCH_SHELL = {
    "SLURM_JOB_ID": "777",
    "SLURM_NTASKS": "8",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_JOB_NODELIST": "node[07-08]",
    "SLURM_NNODES": "2",
    "SLURM_TASKS_PER_NODE": "4(x2)",
}
TORCHRUN_WORKER = {
    "TORCHELASTIC_RUN_ID": "r1",
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "MASTER_ADDR": "node07",
    "MASTER_PORT": "29400",
}
OMPI = {
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}
ARGV = ["train.py"]


def test_documented_order():
    assert [s.name for s in SCHEMES] == ["torchrun", "slurm", "openmpi", "pmi", "kubeflow", "local"]


def test_plain_python_is_local():
    info = detect_environment({}, argv=ARGV)
    assert info == EnvInfo("local", 0, 0, 1, 1, 0, 1, "127.0.0.1", 29500, ())
    assert detect_environment({"MASTER_PORT": "31000"}, argv=ARGV).main_port == 31000


def test_python_in_sbatch_script_is_local_not_rank_0_of_8():
    assert detect_environment(SBATCH_SHELL, argv=ARGV).scheme == "local"


def test_torchrun_inside_sbatch_script_is_torchrun():
    info = detect_environment(SBATCH_SHELL | TORCHRUN_WORKER, argv=ARGV)
    assert (info.scheme, info.rank, info.world_size, info.node_rank) == ("torchrun", 3, 4, 1)


def test_torchrun_under_srun_is_torchrun():
    # `srun -N2 torchrun --nproc-per-node 2 ...`: workers see the srun step (1 task per node) too
    info = detect_environment(SLURM_STEP | TORCHRUN_WORKER, argv=ARGV)
    assert (info.scheme, info.rank, info.main_port) == ("torchrun", 3, 29400)


def test_srun_step_is_slurm():
    info = detect_environment(SLURM_STEP, argv=ARGV)
    assert (info.scheme, info.rank, info.world_size, info.main_address, info.main_port) == (
        "slurm",
        1,
        2,
        "node07",
        15777,
    )


def test_openmpi_beats_local_and_a_daemon_step():
    assert detect_environment(OMPI, argv=ARGV).scheme == "openmpi"
    assert detect_environment(SLURM_STEP | OMPI, argv=ARGV).scheme == "openmpi"


def test_pmi_and_kubeflow_detected():
    assert detect_environment({"PMI_RANK": "0", "PMI_SIZE": "1"}, argv=ARGV).scheme == "pmi"
    pod = {"MASTER_ADDR": "m", "MASTER_PORT": "1234", "RANK": "1", "WORLD_SIZE": "2"}
    assert detect_environment(pod, argv=ARGV).scheme == "kubeflow"
    # the same variables plus the legacy launcher's --local_rank flag are torchrun's
    assert detect_environment(pod | {"MASTER_ADDR": "127.0.0.1"}, argv=["t.py", "--local_rank=1"]).scheme == "torchrun"


def test_forced_scheme_skips_detection():
    info = detect_environment(SLURM_STEP | OMPI, forced="slurm", argv=ARGV)
    assert (info.scheme, info.rank) == ("slurm", 1)
    assert detect_environment(OMPI | {"SHOAL_ENV": "local"}, argv=ARGV).scheme == "local"
    assert detect_environment(OMPI | {"SHOAL_ENV": "OpenMPI "}, argv=ARGV).scheme == "openmpi"
    assert detect_environment(OMPI | {"SHOAL_ENV": "auto"}, argv=ARGV).scheme == "openmpi"
    assert detect_environment(OMPI | {"SHOAL_ENV": "slurm"}, forced="openmpi", argv=ARGV).scheme == "openmpi"


def test_unknown_forced_scheme_lists_valid_names():
    with pytest.raises(ShoalError, match="unknown launch scheme 'lsf'") as err:
        detect_environment({"SHOAL_ENV": "lsf"}, argv=ARGV)
    assert "torchrun, slurm, openmpi, pmi, kubeflow, local" in err.value.hint


def test_forced_scheme_without_its_variables_names_them():
    with pytest.raises(ShoalError, match="slurm: SLURM_STEP_ID not set") as err:
        detect_environment(SBATCH_SHELL | {"SHOAL_ENV": "slurm"}, argv=ARGV)
    assert "srun" in err.value.hint
    with pytest.raises(ShoalError, match="openmpi: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE"):
        detect_environment({}, forced="openmpi", argv=ARGV)


def test_half_set_torch_variables_are_refused():
    with pytest.raises(ShoalError, match="WORLD_SIZE=4 set, but not RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT") as e:
        detect_environment({"WORLD_SIZE": "4"}, argv=ARGV)
    assert "SHOAL_ENV=local" in e.value.hint
    # a pod missing only MASTER_PORT says so
    with pytest.raises(ShoalError, match="not LOCAL_RANK, MASTER_PORT"):
        detect_environment({"MASTER_ADDR": "m", "RANK": "0", "WORLD_SIZE": "2"}, argv=ARGV)
    assert detect_environment({"WORLD_SIZE": "4"}, forced="local", argv=ARGV).world_size == 1


def test_inconsistent_values_surface_from_detection():
    with pytest.raises(ShoalError, match="OMPI_COMM_WORLD_RANK=2 is not below OMPI_COMM_WORLD_SIZE=2"):
        detect_environment(OMPI | {"OMPI_COMM_WORLD_RANK": "2"}, argv=ARGV)


def test_defaults_read_os_environ_and_sys_argv_without_changing_them():
    legacy = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}
    with mock.patch.dict(os.environ, legacy, clear=True), mock.patch.object(sys, "argv", ["t.py", "--local-rank=1"]):
        before = dict(os.environ)
        info = detect_environment()
        assert (info.scheme, info.local_rank) == ("torchrun", 1)
        assert dict(os.environ) == before


def test_torch_env_vars_round_trip():
    info = detect_environment(
        SBATCH_SHELL | {"SLURM_STEP_ID": "3", "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "1"}, argv=ARGV
    )
    assert info.scheme == "slurm"
    exported = torch_env_vars(info)
    assert exported == {
        "MASTER_ADDR": "node07",
        "MASTER_PORT": "15777",
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
    }
    assert all(isinstance(v, str) for v in exported.values())
    # a child process that inherits them sees the same place in the job (as torchrun)
    child = detect_environment(exported, argv=ARGV)
    assert child.scheme == "torchrun"
    assert child == EnvInfo("torchrun", 5, 1, 8, 4, 1, 2, "node07", 15777, child.reason)
