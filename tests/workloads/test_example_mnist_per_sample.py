"""examples/mnist_per_sample.py (the tutorials' per-sample DDP baseline) runs under ``shoal run``."""

from __future__ import annotations

import json

import pytest

from conftest import ROOT, run_shoal

SCRIPT = ROOT / "examples" / "mnist_per_sample.py"


@pytest.mark.multiprocess
def test_per_sample_example_trains_on_two_workers(mnist_root, tmp_path):
    out = tmp_path / "out.json"
    result = run_shoal(
        "run",
        "--nproc",
        "2",
        str(SCRIPT),
        "--data",
        str(mnist_root),
        "--epochs",
        "1",
        "--limit",
        "2048",
        "--json",
        str(out),
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(out.read_text())
    (epoch,) = summary["epochs"]
    assert epoch["epoch"] == 1
    assert epoch["test_acc"] > 0.5
    assert summary["world_size"] == 2
    assert summary["train_samples"] == 2048
    assert "epoch 1/1  test_acc " in result.stdout
