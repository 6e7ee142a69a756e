"""Slurm job steps, and the batch-script / salloc shells that must not look like one."""

from __future__ import annotations

import pytest

from shoal.env.slurm import SlurmEnvironment, allocation_beyond, allocation_first_node, slurm_port, step_run_id
from shoal.errors import ShoalError

# Task 5 of `srun -n 7` over gpu01,gpu02,gpu03,gpu7 with 2,2,2,1 tasks: node 2, local rank 1.
STEP = {
    "SLURM_JOB_ID": "123456",
    "SLURM_JOB_NODELIST": "gpu[01-03,7],cpu5",
    "SLURM_JOB_NUM_NODES": "5",
    "SLURM_NTASKS": "7",
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "2",
    "SLURM_STEP_NUM_TASKS": "7",
    "SLURM_STEP_NUM_NODES": "4",
    "SLURM_STEP_TASKS_PER_NODE": "2(x3),1",
    "SLURM_STEP_NODELIST": "gpu[01-03,7]",
}

# A batch script's own environment (no srun): Slurm exports SLURM_PROCID=0 there too.
BATCH = {
    "SLURM_JOB_ID": "200505",
    "SLURM_JOB_NODELIST": "gnode[10,20,25,37]",
    "SLURM_NODELIST": "gnode[10,20,25,37]",
    "SLURM_NNODES": "4",
    "SLURM_NTASKS": "4",
    "SLURM_TASKS_PER_NODE": "1(x4)",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
}


def test_srun_step():
    assert SlurmEnvironment.detect(STEP)
    info = SlurmEnvironment.describe(STEP)
    assert (info.scheme, info.rank, info.world_size, info.local_rank, info.node_rank) == ("slurm", 5, 7, 1, 2)
    assert (info.num_nodes, info.local_world_size) == (4, 2)
    assert info.main_address == "gpu01"
    assert info.main_port == 15000 + 123456 % 5000 == 18456
    assert "SLURM_STEP_ID=0" in info.reason and "SLURM_PROCID=5" in info.reason


def test_last_node_of_compressed_tasks_per_node():
    env = STEP | {"SLURM_PROCID": "6", "SLURM_NODEID": "3", "SLURM_LOCALID": "0"}
    info = SlurmEnvironment.describe(env)
    assert (info.local_world_size, info.node_rank, info.local_rank) == (1, 3, 0)


def test_batch_script_is_not_a_step():
    assert not SlurmEnvironment.detect(BATCH)


def test_salloc_shell_is_not_a_step():
    salloc = {k: v for k, v in BATCH.items() if k not in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID")}
    assert not SlurmEnvironment.detect(salloc)


@pytest.mark.parametrize("special", ["4294967290", "4294967291", "4294967292"])
def test_interactive_batch_and_extern_step_ids_are_not_launches(special):
    # `srun --pty bash` / salloc's interactive step: a shell, one task, whatever SLURM_NTASKS says
    env = STEP | {"SLURM_STEP_ID": special, "SLURM_STEPID": special}
    assert not SlurmEnvironment.detect(env)


def test_legacy_stepid_name_is_enough():
    env = {k: v for k, v in STEP.items() if k != "SLURM_STEP_ID"}
    assert SlurmEnvironment.detect(env)
    assert SlurmEnvironment.describe(env).rank == 5


def test_mpirun_inside_allocation_defers_to_mpi():
    # mpirun starts one daemon per node with srun; the ranks inherit that step's variables.
    daemons = STEP | {"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x4)"}
    assert not SlurmEnvironment.detect(daemons | {"OMPI_COMM_WORLD_RANK": "9", "OMPI_COMM_WORLD_SIZE": "16"})
    assert not SlurmEnvironment.detect(daemons | {"PMI_RANK": "9", "PMI_SIZE": "16"})
    # srun --mpi=pmi2 exports PMI_* that agree with the step: still slurm
    assert SlurmEnvironment.detect(STEP | {"PMI_RANK": "5", "PMI_SIZE": "7"})


def test_job_level_fallbacks():
    env = {
        "SLURM_STEP_ID": "1",
        "SLURM_JOB_ID": "42",
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_NNODES": "2",
        "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURM_NODELIST": "n[7-8]",
    }
    info = SlurmEnvironment.describe(env)
    assert (info.rank, info.world_size, info.local_world_size, info.num_nodes) == (3, 4, 2, 2)
    assert (info.main_address, info.main_port) == ("n7", 15042)


def test_even_split_without_tasks_per_node():
    env = {k: v for k, v in STEP.items() if "TASKS_PER_NODE" not in k} | {
        "SLURM_STEP_NUM_TASKS": "8",
        "SLURM_NTASKS": "8",
    }
    assert SlurmEnvironment.describe(env).local_world_size == 2
    with pytest.raises(ShoalError, match="does not divide evenly"):
        SlurmEnvironment.describe(env | {"SLURM_STEP_NUM_TASKS": "7"})


def test_master_addr_and_port_override():
    info = SlurmEnvironment.describe(STEP | {"MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "23456"})
    assert (info.main_address, info.main_port) == ("10.1.2.3", 23456)


def test_port_formula_stays_in_range_and_separates_neighbouring_jobs():
    ports = [slurm_port(job) for job in range(1_000_000, 1_005_000)]
    assert min(ports) == 15000 and max(ports) == 19999
    assert len(set(ports)) == 5000  # 5000 consecutive jobs never share a port
    no_job = {k: v for k, v in STEP.items() if k != "SLURM_JOB_ID"}
    assert SlurmEnvironment.describe(no_job).main_port == 29500


@pytest.mark.parametrize(
    "change, message",
    [
        ({"SLURM_PROCID": "7"}, "SLURM_PROCID=7 is not below SLURM_STEP_NUM_TASKS=7"),
        ({"SLURM_NODEID": "4"}, "SLURM_NODEID=4 is not below SLURM_STEP_NUM_NODES=4"),
        ({"SLURM_LOCALID": "2"}, "SLURM_LOCALID=2 is not below SLURM_STEP_TASKS_PER_NODE\\[2\\]=2"),
        ({"SLURM_PROCID": "five"}, "SLURM_PROCID='five' is not an integer"),
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x3"}, "SLURM_STEP_TASKS_PER_NODE='2\\(x3' is malformed"),
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x4)"}, "gives 8 tasks on 4 nodes"),
        ({"SLURM_STEP_NODELIST": "gpu[01-03"}, "SLURM_STEP_NODELIST='gpu\\[01-03' is malformed"),
        ({"SLURM_JOB_ID": "12a"}, "SLURM_JOB_ID='12a' is not an integer"),
    ],
)
def test_inconsistent_values_name_the_variable(change, message):
    with pytest.raises(ShoalError, match=message) as err:
        SlurmEnvironment.describe(STEP | change)
    assert err.value.hint


def test_missing_variables_are_named():
    with pytest.raises(ShoalError, match="slurm: SLURM_STEP_ID not set") as err:
        SlurmEnvironment.describe(BATCH)
    assert "srun" in err.value.hint
    with pytest.raises(ShoalError, match="SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID not set"):
        SlurmEnvironment.describe({"SLURM_STEP_ID": "0"})


def test_allocation_variables_outside_a_step():
    """What launchers read of an allocation they run in: its first node, what it asks beyond them."""
    assert allocation_first_node(BATCH) == "gnode10"
    assert allocation_first_node({}) is None
    with pytest.raises(ShoalError, match="SLURM_JOB_NODELIST='gnode\\[10' is malformed"):
        allocation_first_node({"SLURM_JOB_NODELIST": "gnode[10"})
    assert allocation_beyond({"SLURM_JOB_ID": "1", "SLURM_NNODES": "2"}, 8) == "SLURM_NNODES=2"
    assert allocation_beyond({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "4"}, 2) == "SLURM_NTASKS=4"
    assert allocation_beyond({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "4"}, 4) is None
    assert allocation_beyond({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "2(x3)"}, 1) is None  # not a plain count
    assert allocation_beyond({"SLURM_NTASKS": "4"}, 1) is None  # no allocation
    assert step_run_id(STEP) == "slurm-123456.0"
    assert step_run_id({}) is None
