"""The sbatch script of a fault-tolerant command (:mod:`shoal.jobs.slurm_fault_tolerance`), pinned by
golden files, and what ``shoal launch slurm`` refuses for it (one line + HINT, nothing written).

Regenerate after an intended change, then review the diff::

    SHOAL_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/jobs/test_render_slurm_fault_tolerance.py
    git diff tests/jobs/golden/slurm/

The script is run for real on Slurm by tests/train/ft/test_ft_slurm.py; here nothing starts but ``bash -n``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from shoal.cli import launch as launch_cli
from shoal.errors import ShoalError
from shoal.jobs.slurm import SlurmOptions
from shoal.jobs.slurm_fault_tolerance import MAX_RESTARTS, render_replica_sbatch
from shoal.jobs.spec import JobSpec

GOLDEN = Path(__file__).parent / "golden" / "slurm"
TRAIN = ("shoal", "train", "digits", "--fault-tolerance", "--out", "/shared/run")
PYTHON = "/opt/venv/bin/python"

CASES = {
    "sbatch_fault_tolerance.txt": lambda: render_replica_sbatch(
        JobSpec(
            command=TRAIN,
            nodes=4,
            job_name="digits",
            max_restarts=MAX_RESTARTS,
            env=(("NCCL_DEBUG", "INFO"),),
            python=PYTHON,
            shoal=(PYTHON, "-m", "shoal"),
        ),
        SlurmOptions(cpus_per_node=8, spare_nodes=1, partition="cpu", time_limit="2:00:00"),
    ),  # fmt: skip
    "sbatch_fault_tolerance_own_lighthouse.txt": lambda: render_replica_sbatch(
        JobSpec(
            command=(*TRAIN, "--lighthouse", "http://10.0.0.9:29510", "--nproc-per-group", "2"),
            nodes=1,
            nproc=4,
            master_port=29511,
            max_restarts=3,
        ),
        SlurmOptions(),
    ),  # fmt: skip
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case):
    text = CASES[case]()
    path = GOLDEN / case
    if os.environ.get("SHOAL_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: regenerate with SHOAL_UPDATE_GOLDEN=1 (see the module docstring)"
    assert text == path.read_text(), f"{case} differs from {path}: review, then regenerate if intended"
    # bash parses it (the loop, the functions, the quoting).
    assert subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True).returncode == 0


def test_no_golden_file_is_stale():
    assert sorted(p.name for p in GOLDEN.iterdir()) == sorted(CASES)


def test_each_group_is_a_step_of_its_own_beside_a_lighthouse_on_the_batch_host():
    script = CASES["sbatch_fault_tolerance.txt"]()
    assert "#SBATCH --nodes=5\n#SBATCH --ntasks-per-node=1\n#SBATCH --cpus-per-task=8\n" in script  # one spare
    assert "#SBATCH --no-kill\n" in script and "--signal" not in script  # a group's launcher takes no SIGUSR1
    flat = script.replace(" \\\n       ", "")  # the srun line, continuations joined
    assert (
        "SHOAL_REPLICA_STARTS=$((restarts[$1] + 1)) srun --nodes=1 --ntasks=1 --cpus-per-task=8 --exact --mem=0" in flat
    )
    assert '--nnodes 4 --node-rank "$1" --nproc 1 --master-addr "$head_addr" --lighthouse "$lighthouse" &' in script
    assert '-m shoal.train.ft.serve_lighthouse --bind "$head_addr:$port" --groups 4 &' in script
    assert "restarts[group] < 10" in script and "((code == 2))" in script
    own = CASES["sbatch_fault_tolerance_own_lighthouse.txt"]()
    assert "serve_lighthouse" not in own.replace("serve_lighthouse --address", "")  # only its address is asked for
    assert "#SBATCH --ntasks-per-node=2\n#SBATCH --cpus-per-task=2\n" in own  # 4 processes: 2 groups of 2
    assert '--nnodes 2 --node-rank "$1" --nproc 2 --master-addr "$head_addr" &' in own


def test_the_default_restarts_are_the_groups_own():
    from shoal.train.ft.supervisor import DEFAULT_MAX_RESTARTS

    assert MAX_RESTARTS == DEFAULT_MAX_RESTARTS


def _dry(capsys, *argv: str) -> str:
    assert launch_cli.main_raw(["slurm", *argv, "--dry-run", "--", *TRAIN]) == 0
    return capsys.readouterr().out


def test_cli_renders_a_fault_tolerant_command_with_its_defaults(capsys):
    out = _dry(capsys, "--nodes", "2")
    assert "2 replica groups" in out and "restarts[group] < 10" in out and "#SBATCH --nodes=2\n" in out
    out = _dry(capsys, "--nodes", "2", "--max-restarts", "0", "--spare-nodes", "2")
    assert "restarts[group] < 0" in out and "#SBATCH --nodes=4\n" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--nodes", "2", "--gpus-per-node", "1"], "runs on the CPU for now"),
        (["--nodes", "2", "--", *TRAIN, "--device", "cuda"], "runs on the CPU for now"),
        (["--nodes", "2", "--one-task-per-process"], "each replica group is a job step of its own already"),
        (["--nodes", "1"], "one replica group"),
        (["--nodes", "2", "--", *TRAIN[:-2]], "needs --out in the command"),
        (["--nodes", "2", "--", *TRAIN, "--nnodes", "2"], "--nnodes in a fault-tolerant command"),
        (["--nodes", "2", "--", *TRAIN, "--master-addr=10.0.0.1"], "--master-addr in a fault-tolerant command"),
        (["--nproc-per-node", "3", "--", *TRAIN, "--nproc-per-group", "2"], "not a whole number of groups"),
        (["--nodes", "2", "--spare-nodes", "-1"], "--spare-nodes must be 0 or more"),
        (["--nodes", "2", "--spare-nodes", "1", "--", "train.py"], "--spare-nodes is for"),
    ],
)
def test_cli_refuses_what_cannot_work(tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    if "--" not in argv:
        argv = [*argv, "--", *TRAIN]
    with pytest.raises(ShoalError, match=message) as err:
        launch_cli.main_raw(["slurm", *argv])
    assert err.value.hint and "\n" not in err.value.message and "\n" not in err.value.hint
    assert not list(tmp_path.iterdir())  # nothing written, nothing submitted
