"""Nothing of the job's environment that looks like a secret appears in what shoal writes (issue 15):
config.json, metrics, checkpoints' configuration, tracker files, kept worker and agent logs, and
every rendered launch command, script or manifest."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import warm
from conftest import shoal_cmd

SECRETS = {
    "MY_API_TOKEN": "tok-2c4e6a8b0d",
    "AWS_SECRET_ACCESS_KEY": "key-9f7d5b3a1e",
    "DB_PASSWORD": "pw-7b5d3f1a9c",
}
SCRIPT = Path(__file__).parent / "launch" / "scripts" / "allreduce.py"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHOAL_", "WANDB_", "MLFLOW_"))}
    return {**env, **SECRETS}


def _leaks(root: Path) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found += [f"{path}: {name}" for name, value in SECRETS.items() if value.encode() in data]
    return found


@pytest.mark.multiprocess
def test_training_runs_and_kept_logs_hold_no_secret(tmp_path):
    run = tmp_path / "run"
    train = warm.run(
        shoal_cmd("train", "digits", "--nproc", "2", "--epochs", "1", "--device", "cpu", "--out", str(run),
                  "--tracker", "tensorboard"),
        capture_output=True, text=True, timeout=300, env=_env(),
    )  # fmt: skip
    assert train.returncode == 0, train.stderr
    logs = tmp_path / "logs"
    out = tmp_path / "out"
    out.mkdir()
    job = warm.run(
        shoal_cmd("run", "--nproc", "2", "--log-dir", str(logs), "--verbose", str(SCRIPT), str(out)),
        capture_output=True, text=True, timeout=300, env=_env(),
    )  # fmt: skip
    assert job.returncode == 0, job.stderr
    # Both ranks' kept logs are searched (with --verbose torch's agent logs go to the console, checked below).
    assert sorted(p.parent.name for p in logs.rglob("stderr.log")) == ["0", "1"], sorted(logs.rglob("*"))
    assert _leaks(run) == [] and _leaks(logs) == []
    for value in SECRETS.values():
        assert value not in train.stdout + train.stderr + job.stdout + job.stderr


@pytest.mark.parametrize(
    "form",
    [
        ["launch", "--hosts", "node1:2,node2:2", "--via", "ssh", "--dry-run"],
        ["launch", "--hosts", "node1:2,node2:2", "--via", "mpirun", "--dry-run"],
        ["launch", "slurm", "--nodes", "2", "--dry-run"],
        ["launch", "manual", "--hosts", "node1:2,node2:2"],
        ["launch", "k8s", "--kind", "pytorchjob", "--name", "job", "--image", "img:1", "--nodes", "2", "--dry-run"],
        ["launch", "runai", "--name", "job", "--image", "img:1", "--nodes", "2"],
    ],
)
def test_rendered_launches_hold_no_secret(form, tmp_path):
    proc = warm.run(
        shoal_cmd(*form, "--", "shoal", "train", "digits"), capture_output=True, text=True, timeout=120,
        env=_env(), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert all(value not in proc.stdout + proc.stderr for value in SECRETS.values())
    assert _leaks(tmp_path) == []


@pytest.mark.parametrize(
    "form, env",
    [
        (["launch", "--hosts", "node1:2,node2:2", "--via", "ssh", "--dry-run"], "DB_PASSWORD"),
        (["launch", "k8s", "--kind", "pytorchjob", "--name", "job", "--image", "img:1", "--dry-run"], "DB_PASSWORD"),
        (["launch", "--hosts", "node1:2,node2:2", "--via", "mpirun", "--dry-run"], "DB_PASSWORD=typed-in-clear"),
        (["launch", "slurm", "--nodes", "2", "--dry-run"], "DB_PASSWORD=typed-in-clear"),
    ],
)
def test_a_secret_whose_value_would_be_written_is_refused(form, env, tmp_path):
    """A secret's value would land in the launch line (SSH inlines the shell's value; a manifest
    holds values; NAME=VALUE is typed in clear): refused with the way to pass it; nothing written."""
    proc = warm.run(
        shoal_cmd(*form, "--env", env, "--", "shoal", "train", "digits"),
        capture_output=True, text=True, timeout=120, env=_env(), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("shoal: error: ") and "DB_PASSWORD" in lines[0] and lines[1].startswith("HINT: ")
    assert SECRETS["DB_PASSWORD"] not in proc.stdout + proc.stderr and "typed-in-clear" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "form",
    [
        ["launch", "--hosts", "node1:2,node2:2", "--via", "mpirun", "--dry-run"],
        ["launch", "slurm", "--nodes", "2", "--dry-run"],
    ],
)
def test_a_secret_passed_by_name_stays_a_name(form, tmp_path):
    """mpirun (``-x NAME``) and sbatch (its exported environment) carry a variable by name."""
    proc = warm.run(
        shoal_cmd(*form, "--env", "DB_PASSWORD", "--", "shoal", "train", "digits"),
        capture_output=True, text=True, timeout=120, env=_env(), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert SECRETS["DB_PASSWORD"] not in proc.stdout + proc.stderr
