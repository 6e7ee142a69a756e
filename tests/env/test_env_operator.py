"""Launchers in pods with only the classic variables, and launchers that see a larger job they are not
part of: pure functions over environment mappings (no process started).

The classic shape is what Run:ai's distributed PyTorch pods carry (the Kubeflow training operator's
MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE = pods before 1.7, no PET_*; Run:ai adds JOB_NAME,
JOB_UUID, POD_INDEX, POD_UUID, RUNAI_NUM_OF_GPUS and NODE_NAME: run-ai/docs,
docs/Researcher/best-practices/env-variables.md). Its pods meeting for real: tests/k8s/test_runai_pods.py.
"""

from __future__ import annotations

import pytest

from shoal.env.detect import detected_scheme
from shoal.env.kubeflow import KubeflowEnvironment
from shoal.env.local import LocalEnvironment
from shoal.env.openmpi import OpenMPIEnvironment
from shoal.env.operator import classic_pod, classic_pod_line, operator_defaults
from shoal.errors import ShoalError
from shoal.launch.local import Placement, check_allocation, placement, refuse_rank_launching_alone
from shoal.launch.options import LaunchOptions

RUNAI_WORKER = {
    "MASTER_ADDR": "dist-train1-master-0",
    "MASTER_PORT": "23456",
    "RANK": "1",
    "WORLD_SIZE": "2",
    "PYTHONUNBUFFERED": "0",
    "JOB_NAME": "dist-train1",
    "JOB_UUID": "0b6f7a1e-1111-4c3a-9e55-3d5a0c1c2f00",
    "POD_INDEX": "1",
    "POD_UUID": "6d0c6e0a-2222-4b1b-8a77-5f0e2b7f9a11",
    "NODE_NAME": "gpu-node-3",
}
OMPI_RANK_3_OF_4 = {
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "MASTER_ADDR": "10.77.0.1",
}
SRUN_TASK_1_OF_2 = {
    "SLURM_JOB_ID": "42",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "0",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_NUM_NODES": "1",
    "SLURM_STEP_NODELIST": "node1",
}


def test_a_runai_pod_is_node_rank_of_world_size_on_the_master():
    assert classic_pod(RUNAI_WORKER)
    defaults = operator_defaults(RUNAI_WORKER, gpus=0)
    assert defaults == {
        "nnodes": "2",
        "node_rank": 1,
        "master_addr": "dist-train1-master-0",
        "master_port": 23456,
        "rdzv_backend": "static",
        "nproc": 1,  # no GPU: one process per pod
    }
    assert operator_defaults(RUNAI_WORKER, gpus=4)["nproc"] == 4  # one per GPU
    options = LaunchOptions(**{**defaults, "nproc": 3})  # a flag given wins, as for PET_*
    assert (options.nproc, options.nnodes, options.node_rank, options.several_nodes) == (3, "2", 1, True)


def test_the_line_names_every_variable_read():
    line = classic_pod_line("shoal run", RUNAI_WORKER)
    assert line.startswith("shoal run: this pod is node 1 of 2")
    for used in ("RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=dist-train1-master-0", "MASTER_PORT=23456", "no PET_*"):
        assert used in line


@pytest.mark.parametrize(
    "extra, why",
    [
        ({"LOCAL_RANK": "0"}, "a torchrun worker"),
        ({"TORCHELASTIC_RUN_ID": "x", "LOCAL_RANK": "0"}, "a torchrun worker"),
        ({"PET_NNODES": "2", "PET_NODE_RANK": "1"}, "the operator's PET_* describe it"),
        (OMPI_RANK_3_OF_4, "an MPI rank"),
        (SRUN_TASK_1_OF_2, "a Slurm task"),
        ({"WORLD_SIZE": "1", "RANK": "0"}, "a single pod: a standalone job is right"),
        ({"SHOAL_ENV": "kubeflow"}, "forced: this process is the pod's one rank"),
    ],
)
def test_not_a_classic_pod(extra, why):
    assert not classic_pod({**RUNAI_WORKER, **extra}), why


def test_partial_classic_variables_are_no_pod():
    partial = {k: v for k, v in RUNAI_WORKER.items() if k != "MASTER_PORT"}
    assert not classic_pod(partial) and operator_defaults(partial, gpus=0) == {}


@pytest.mark.parametrize(
    "change, named",
    [({"RANK": "2"}, "RANK=2 is not below WORLD_SIZE=2"), ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two'")],
)
def test_inconsistent_variables_are_one_named_error(change, named):
    with pytest.raises(ShoalError, match=named) as info:
        operator_defaults({**RUNAI_WORKER, **change}, gpus=0)
    assert info.value.hint


def test_a_kubeflow_pod_with_pet_variables_keeps_its_rules():
    pet = {**RUNAI_WORKER, "WORLD_SIZE": "4", "PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "2"}
    defaults = operator_defaults(pet, gpus=0)
    assert (defaults["nnodes"], defaults["nproc"]) == ("2", 2)  # WORLD_SIZE (pods x 2) is not read


def test_detected_scheme_is_detection_only():
    assert detected_scheme(RUNAI_WORKER, argv=()) is KubeflowEnvironment
    assert detected_scheme(OMPI_RANK_3_OF_4, argv=()) is OpenMPIEnvironment
    assert detected_scheme({"RANK": "1"}, argv=()) is LocalEnvironment  # describing it would raise


def test_a_classic_pod_starts_workers_and_says_which_variables(capfd):
    options = LaunchOptions.from_environment(environ=RUNAI_WORKER)
    assert placement(options, environ=RUNAI_WORKER) is Placement.WORKERS
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "this pod is node 1 of 2" in err


def test_a_rank_of_mpirun_or_srun_joins_as_that_rank():
    assert placement(LaunchOptions(), environ=OMPI_RANK_3_OF_4) is Placement.RANK
    assert placement(LaunchOptions(), environ=SRUN_TASK_1_OF_2) is Placement.RANK
    assert placement(LaunchOptions(), environ={**RUNAI_WORKER, "SHOAL_ENV": "kubeflow"}) is Placement.RANK  # forced
    assert placement(LaunchOptions(), environ={}) is Placement.ALONE
    assert placement(LaunchOptions(nproc=2), environ={}) is Placement.WORKERS


TORCHRUN_RANK_1_OF_4 = {
    "TORCHELASTIC_RUN_ID": "j", "RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "29500",
}  # fmt: skip


def test_options_that_agree_with_the_outer_launcher_are_the_same_job():
    """A script that says nproc=2 (and nnodes=2) run under torchrun's 2 per node on 2 nodes: this
    process is its rank, as Lightning's Trainer(devices=2) under torchrun is."""
    assert placement(LaunchOptions(nproc=2), environ=TORCHRUN_RANK_1_OF_4) is Placement.RANK
    assert (
        placement(LaunchOptions(nproc=2, nnodes="2", master_addr="h"), environ=TORCHRUN_RANK_1_OF_4) is Placement.RANK
    )


@pytest.mark.parametrize(
    "options", [LaunchOptions(nproc=4), LaunchOptions(nproc=2, nnodes="3", master_addr="h")], ids=["nproc", "nnodes"]
)
def test_options_that_disagree_with_the_outer_launcher_are_refused(options):
    with pytest.raises(ShoalError) as info:
        placement(options, environ=TORCHRUN_RANK_1_OF_4)
    assert "torchrun already started this process as rank 1 of 4 (2 per node on 2 nodes)" in info.value.message
    assert "drop --nproc" in info.value.hint


@pytest.mark.parametrize(
    "environ, scheme, hint",
    [
        (OMPI_RANK_3_OF_4, "openmpi started this process as rank 3 of 4", "mpirun starts every process"),
        (SRUN_TASK_1_OF_2, "slurm started this process as rank 1 of 2", "srun started one copy per task"),
        (
            {
                "TORCHELASTIC_RUN_ID": "j",
                "RANK": "1",
                "WORLD_SIZE": "2",
                "LOCAL_RANK": "1",
                "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "h",
            },
            "torchrun started this process as rank 1 of 2",
            "already a torchrun worker",
        ),
    ],
)
def test_a_launcher_started_as_one_rank_of_several_never_runs_alone(environ, scheme, hint):
    with pytest.raises(ShoalError, match=scheme) as info:
        refuse_rank_launching_alone("shoal run", environ)
    assert "shoal run would start a standalone job" in info.value.message and hint in info.value.hint


def test_a_launcher_alone_is_left_alone():
    refuse_rank_launching_alone("shoal run", {})
    refuse_rank_launching_alone("shoal run", {**SRUN_TASK_1_OF_2, "SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0",
                                              "SLURM_LOCALID": "0"})  # fmt: skip


BATCH_SCRIPT = {"SLURM_JOB_ID": "42", "SLURM_NTASKS": "4", "SLURM_JOB_NUM_NODES": "1", "SLURM_PROCID": "0"}


def test_an_allocation_bigger_than_the_job_is_refused():
    with pytest.raises(ShoalError, match="SLURM_NTASKS=4: this Slurm allocation asks for more than the 1") as info:
        check_allocation(LaunchOptions(), BATCH_SCRIPT)
    assert "srun" in info.value.hint
    with pytest.raises(ShoalError, match="SLURM_JOB_NUM_NODES=2"):
        check_allocation(LaunchOptions(nproc=4), {**BATCH_SCRIPT, "SLURM_JOB_NUM_NODES": "2"})
    with pytest.raises(ShoalError, match="SLURM_NTASKS=4"):  # what shoal train/fit/demo decide through
        placement(LaunchOptions(), environ=BATCH_SCRIPT)


def test_an_allocation_the_job_fills_is_fine():
    check_allocation(LaunchOptions(nproc=4), BATCH_SCRIPT)  # sbatch --ntasks 4 + --nproc 4
    check_allocation(LaunchOptions(), {**BATCH_SCRIPT, "SHOAL_ENV": "local"})  # said on purpose
    check_allocation(LaunchOptions(nnodes="2", master_addr="h"), BATCH_SCRIPT)  # its own rendezvous
    check_allocation(LaunchOptions(), {"SLURM_JOB_ID": "42"})  # no count: one task


def test_an_srun_step_of_one_task_in_a_bigger_allocation_is_not_the_allocation():
    """``srun -N1 -n1 shoal run --nproc 2`` in a 2-node sbatch job: the step is one task; the job's
    node count is not this launcher's to fill."""
    step = {**BATCH_SCRIPT, "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "1", "SLURM_STEP_ID": "0"}
    step.update(SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0", SLURM_STEP_NUM_TASKS="1")
    step.update(SLURM_STEP_NUM_NODES="1", SLURM_STEP_NODELIST="node1")
    check_allocation(LaunchOptions(nproc=2), step)
    assert placement(LaunchOptions(nproc=2), environ=step) is Placement.WORKERS
