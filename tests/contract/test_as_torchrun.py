"""The shim that gives a rank started by mpirun or srun torchrun's variables (shoal.launch.as_torchrun).

Derivation from each launcher's variables here; the shim under a real mpirun and srun, running an
unchanged torchrun-style script, in tests/cluster_mpi and tests/cluster_slurm.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from shoal.errors import ShoalError
from shoal.launch.as_torchrun import parse_argv, torchrun_variables

OMPI_RANK_3_OF_4 = {
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_MCA_ess_base_jobid": "777",
    "MASTER_ADDR": "10.77.0.1",
    "MASTER_PORT": "29511",
}


def test_open_mpi_rank_becomes_torchruns_worker():
    env = torchrun_variables(OMPI_RANK_3_OF_4)
    assert env["RANK"] == env["ROLE_RANK"] == "3" and env["WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "4"
    assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("1", "2")
    assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]) == ("1", "2")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.77.0.1", "29511")
    assert env["TORCHELASTIC_RUN_ID"] == "mpirun-777"
    assert (env["TORCHELASTIC_RESTART_COUNT"], env["TORCHELASTIC_MAX_RESTARTS"]) == ("0", "0")
    assert int(env["OMP_NUM_THREADS"]) >= 1
    assert env["SHOAL_ENV"] == "openmpi"  # shoal's own code still sees the launcher that started it
    assert torchrun_variables({**OMPI_RANK_3_OF_4, "OMP_NUM_THREADS": "7"})["OMP_NUM_THREADS"] == "7"


def test_uneven_nodes_take_their_index_from_the_layout():
    # hosts a:2,b:1,c:1 under -map-by slot: rank 2 is alone on node 1 (rank // local size would say 2)
    rank_2 = {**OMPI_RANK_3_OF_4, "OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
    rank_2["OMPI_COMM_WORLD_LOCAL_SIZE"] = "1"
    env = torchrun_variables(rank_2, (2, 1, 1))
    assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("1", "3", "1")
    with pytest.raises(ShoalError, match="adds up to 5, but the launcher started 4 ranks"):
        torchrun_variables(rank_2, (2, 2, 1))


def test_an_srun_task_becomes_torchruns_worker():
    step = {
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_ID": "41",
        "SLURM_PROCID": "2",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "1",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_STEP_NODELIST": "n[1-2]",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_NNODES": "2",
        "SLURM_TASKS_PER_NODE": "2(x2)",
    }
    env = torchrun_variables(step)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("2", "4", "0", "2")
    assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"], env["MASTER_ADDR"]) == ("1", "2", "n1")
    assert env["TORCHELASTIC_RUN_ID"] == "slurm-41.0"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "no command to run"),
        (["--ranks-per-node", "2,x", "--", "true"], "--ranks-per-node needs counts"),
        (["--ranks-per-node", "2,0", "--", "true"], "every node needs at least 1 rank"),
    ],
)
def test_bad_usage(argv, message):
    with pytest.raises(ShoalError, match=message):
        parse_argv(argv)
    assert parse_argv(["--ranks-per-node", "2,1", "--", "a", "--", "b"]) == ((2, 1), ["a", "--", "b"])


def test_outside_any_launcher_it_is_one_line_and_a_hint():
    # Several nodes' worth of ranks but no address for rank 0: the launcher's variables are not enough.
    env = {k: v for k, v in OMPI_RANK_3_OF_4.items() if k != "MASTER_ADDR"}
    proc = subprocess.run(
        [sys.executable, "-m", "shoal.launch.as_torchrun", "--", "true"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and "MASTER_ADDR is needed" in lines[0] and lines[1].startswith("HINT: ")
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "shoal.launch.as_torchrun",
            "--",
            sys.executable,
            "-c",
            "import os; print(os.environ['GROUP_RANK'])",
        ],
        env=OMPI_RANK_3_OF_4,
        capture_output=True,
        text=True,
    )
    assert (ok.returncode, ok.stdout) == (0, "1\n"), ok.stderr
