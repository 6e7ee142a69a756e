"""A user's workload trained by shoal's loop on real workers: by file path and by module name
through ``shoal train``, as an instance through ``shoal.fit`` (forked and spawned workers), and
resumed exactly from a checkpoint on another world size."""

from __future__ import annotations

import json
import sys

import pytest
import torch

import warm
from conftest import run_shoal
from workloads.user_workload_files import GOOD, write

pytestmark = pytest.mark.multiprocess

FIT_INSTANCE = """
import json, sys
import shoal
from shoal.workloads import get_workload

if __name__ == "__main__":
    workload = get_workload("my_workload.py:tiny")  # an instance built in the user's file (hidden=8)
    workload.defaults = {"epochs": 1, "batch_size": 8, "lr": 0.1}
    runs = {}
    for method in ("fork", "spawn"):
        result = shoal.fit(workload, nproc=2, out="run-" + method, progress=False, device="cpu", start_method=method)
        runs[method] = {"accuracies": result.accuracies, "workload": result.config.workload,
                        "epochs": result.config.epochs, "world": [m["world_size"] for m in result.metrics]}
    print("RESULT " + json.dumps(runs), flush=True)
"""


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_train_by_file_then_resume_by_module_on_another_world_size(tmp_path):
    """``shoal train my_workload.py:Tiny --nproc 2`` for 2 epochs; then the same class, named
    ``my_workload:Tiny`` on PYTHONPATH, resumed from the epoch-1 checkpoint on 1 process with the
    same global batch: every sample once, and the final weights and metrics of the 2-process run."""
    write(tmp_path, "my_workload.py", GOOD)
    common = ["--seed", "3", "--no-progress", "--device", "cpu"]
    ref = run_shoal("train", "my_workload.py:Tiny", "--nproc", "2", "--out", "ref", *common, cwd=tmp_path, timeout=300)
    assert ref.returncode == 0, ref.stderr
    assert "shoal train my_workload.py:Tiny: rank 0/2" in ref.stdout
    config = json.loads((tmp_path / "ref" / "config.json").read_text())
    assert config["workload"] == "my_workload.py:Tiny" and config["epochs"] == 2 and config["batch_size"] == 8
    first = sorted((tmp_path / "ref" / "checkpoints").glob("ckpt-e00001-*.pt"))
    assert len(first) == 1

    resumed = run_shoal(
        "train", "my_workload:Tiny", "--nproc", "1", "--batch-size", "16", "--resume", str(first[0]),
        "--out", "resumed", *common, cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)}, timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stdout and "epoch 2, step 6" in resumed.stdout
    reference, again = _metrics(tmp_path / "ref"), _metrics(tmp_path / "resumed")
    assert [m["epoch"] for m in again] == [2] and again[0]["world_size"] == 1
    assert again[0]["samples_seen"] == reference[1]["samples_seen"] == 96
    assert again[0]["test_accuracy"] == reference[1]["test_accuracy"]
    assert again[0]["test_loss"] == pytest.approx(reference[1]["test_loss"], rel=1e-6)
    a = torch.load(tmp_path / "ref" / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "resumed" / "model.pt", weights_only=True)
    assert a.keys() == b.keys()
    for key in a:  # the same samples in the same global batches; only the sum's order differs
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)


def test_fit_an_instance_on_forked_and_spawned_workers(tmp_path):
    """The instance (hidden=8, its own defaults) reaches the workers: inherited when forked,
    pickled (its class found again by its file) when spawned; both runs agree."""
    write(tmp_path, "my_workload.py", GOOD)
    cmd = [sys.executable, "-c", FIT_INSTANCE]
    proc = warm.run(cmd, script=True, capture_output=True, text=True, timeout=400, cwd=tmp_path)  # driver: warm
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    runs = json.loads(line.removeprefix("RESULT "))
    for run in runs.values():
        assert run["workload"] == "my_workload.py:Tiny" and run["epochs"] == 1 and run["world"] == [2]
    assert runs["fork"]["accuracies"] == runs["spawn"]["accuracies"]
    for method in ("fork", "spawn"):  # hidden=8, not the class's default 16: the instance trained
        state = torch.load(tmp_path / f"run-{method}" / "model.pt", weights_only=True)
        assert state["0.weight"].shape == (8, 4)


def test_own_metrics_when_a_rank_has_no_test_sample(tmp_path):
    write(tmp_path, "my_workload.py", GOOD)
    result = run_shoal(
        "train", "my_workload.py:OneTestSample", "--nproc", "2", "--out", "run", "--no-progress", "--device", "cpu",
        cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (record,) = _metrics(tmp_path / "run")
    assert record["world_size"] == 2 and record["test_abs_error"] >= 0 and "test_accuracy" not in record
