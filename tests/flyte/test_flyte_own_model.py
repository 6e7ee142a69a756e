"""Flyte's multi-GPU MNIST tutorial with its own model (examples/flyte_own_model.py), under real flytekit.

Real MNIST (a subset: 1,000 training and 500 test images, one epoch), two workers, W&B offline and
read back with wandb's own reader:

- the function form: a Flyte task whose body calls ``shoal.run(train_mnist, hp, nproc=2)``; rank 0's
  accuracies and model come back as the task's outputs, the saved ``Net`` scores exactly the accuracy
  reported, and the W&B run (one: rank 0's) holds the config with world size 2, the loss every
  ``log_interval`` batches of this rank's shard, and the table of predictions the model makes;
- the Workload form: the same ``Net`` as a ``shoal.Workload`` in ``train_task``/``fit``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from flyte_harness import TIMEOUT, flyte_environment

from tracking.readers import wandb_runs

pytestmark = pytest.mark.multiprocess

DRIVER = Path(__file__).with_name("flyte_own_model_driver.py")
HP = {"epochs": 1, "train_samples": 1000, "test_samples": 500, "batch_size": 50, "test_batch_size": 100}
LOG_INTERVAL = 4


def call(*args: str, env: dict[str, str], cwd: Path) -> tuple[subprocess.CompletedProcess, dict]:
    """The driver with ``args``, in a process of its own (flytekit's state stays in ``env``'s HOME)."""
    proc = subprocess.run(
        [sys.executable, str(DRIVER), *args], capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=cwd
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    return proc, json.loads(lines[-1].removeprefix("RESULT "))


def test_a_flyte_task_runs_the_tutorials_function_on_two_workers_through_shoal_run(tmp_path, mnist_root):
    env = flyte_environment(tmp_path)
    out = tmp_path / "run"
    out.mkdir()
    hp = {**HP, "log_interval": LOG_INTERVAL}
    inputs = {"hp": hp, "data_dir": str(mnist_root), "out": str(out)}
    # With the test subset's size: the saved Net's guesses and the labels, computed afresh from the file.
    proc, report = call("function_workflow", json.dumps(inputs), str(HP["test_samples"]), env=env, cwd=tmp_path)
    assert report["model_is_flyte_file"]
    (accuracy,) = report["accuracies"]

    guesses, labels = report["guesses"], report["labels"]
    assert sum(g == t for g, t in zip(guesses, labels)) / len(labels) == pytest.approx(accuracy, abs=1e-12)
    assert accuracy > 0.2  # learnt something in one epoch of 1,000 images (chance: 0.1)

    (run,) = wandb_runs(out, env)  # rank 0 logged; rank 1 made no W&B run
    assert run.config["world_size"] == 2
    assert {k: run.config[k] for k in hp} == hp
    losses = run.series("loss")
    shard_batches = math.ceil(HP["train_samples"] / 2 / HP["batch_size"])  # this rank's half of the data
    assert len(losses) == math.ceil(shard_batches / LOG_INTERVAL) and all(0 < v < 3 for v in losses.values())
    assert list(run.series("accuracy").values()) == [pytest.approx(accuracy)]

    (step,) = [s for s, row in run.history().items() if "mnist_predictions._type" in row]
    columns, rows, files = run.table("mnist_predictions", step, Path(env["WANDB_DATA_DIR"]))
    assert columns == ["id", "image", "guess", "truth", *[f"score_{i}" for i in range(10)]]
    logged = [b * 100 + i for b in range(HP["test_samples"] // 100) for i in range(32)]  # 32 of each batch
    assert [row[0] for row in rows] == [f"{i % 100}_{i // 100}" for i in logged]
    assert [row[2] for row in rows] == [guesses[i] for i in logged]  # the model's own guesses...
    assert [row[3] for row in rows] == [labels[i] for i in logged]  # ...of the right images
    assert all(row[1]["_type"] == "image-file" and row[1]["path"] in files for row in rows)
    assert "Train Epoch: 1 batch 0" in proc.stdout and proc.stdout.count("test_loss=") == 1  # rank 0 only


def test_a_flyte_task_trains_the_tutorials_net_as_a_workload(tmp_path, mnist_root):
    env = flyte_environment(tmp_path)
    inputs = {"hp": HP, "data_dir": str(mnist_root), "tracker": "wandb"}
    _, report = call("workload_workflow", json.dumps(inputs), str(HP["test_samples"]), env=env, cwd=tmp_path)
    (accuracy,) = report["accuracies"]
    run = Path(report["model_path"]).parent  # the run directory holds model.pt
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["test_accuracy"] for r in records] == [accuracy] and records[0]["world_size"] == 2

    guesses, labels = report["guesses"], report["labels"]
    # shoal's exact evaluation, every test image once across the two ranks (in other batches: an image
    # whose top two scores tie to the last bit may go the other way)
    correct = sum(g == t for g, t in zip(guesses, labels))
    assert correct / len(labels) == pytest.approx(accuracy, abs=1.5 / HP["test_samples"])

    (wandb_run,) = wandb_runs(run, env)
    assert list(wandb_run.series("epoch/test_accuracy").values()) == [pytest.approx(accuracy)]
    (step,) = [s for s, row in wandb_run.history().items() if "predictions._type" in row]
    columns, rows, _ = wandb_run.table("predictions", step, Path(env["WANDB_DATA_DIR"]))
    assert columns == ["id", "image", "guess", "truth", *[f"score_{i}" for i in range(10)]] and rows
