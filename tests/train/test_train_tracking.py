"""``shoal train --tracker``: what the trainer logs, read back with each tool's own reader.

Two real workers; TensorBoard through its EventAccumulator and W&B (offline: no key here) through
``wandb leet inspect``. The API itself (every backend, MLflow against a real server, failures)
is tested in tests/tracking; here: the trainer's calls, exact numbers, one run per job, resume.
"""

from __future__ import annotations

import json
import signal
import sys

import pytest

import warm
from procs import checkpoints, kill_group, start_cmd, wait_for
from tracking.harness import tool_environment
from tracking.readers import tb_series, tensorboard, wandb_runs

pytestmark = pytest.mark.multiprocess

STEPS_PER_EPOCH = 23  # digits: 1,440 training images, 2 workers x batch 32


def _train(out, env, *extra, timeout=300):
    cmd = [sys.executable, "-m", "shoal", "train", "digits", "--nproc", "2", "--device", "cpu", "--out", str(out)]
    return warm.run([*cmd, *extra], capture_output=True, text=True, timeout=timeout, env=env)


def test_two_workers_log_exact_numbers_once(tmp_path):
    env = tool_environment(tmp_path / "home")
    run = tmp_path / "run"
    proc = _train(
        run, env, "--epochs", "2", "--tracker", "tensorboard,wandb", "--log-every", "10", "--log-predictions", "8"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    board = tensorboard(run / "tensorboard")
    loss = tb_series(board, "train/loss")
    assert sorted(loss) == [10, 20, 30, 40]  # every 10 optimizer steps, across the epoch boundary
    assert all(0 < value < 3 for value in loss.values())
    assert sorted(tb_series(board, "train/lr")) == [10, 20, 30, 40]
    accuracy = tb_series(board, "epoch/test_accuracy")
    assert accuracy == pytest.approx({STEPS_PER_EPOCH * e: m["test_accuracy"] for e, m in enumerate(metrics, 1)})
    assert any("predictions" in tag for tag in board.Tags()["images"])
    (only,) = wandb_runs(run, env)  # one run per job: rank 1 created nothing
    history = only.history()
    output = proc.stdout + proc.stderr
    assert 2 * STEPS_PER_EPOCH in history, f"W&B has steps {sorted(history)} only:\n{output}"
    assert history[2 * STEPS_PER_EPOCH]["epoch/test_loss"] == pytest.approx(metrics[1]["test_loss"])
    assert only.config["lr"] == 0.05 and only.config["extra"]["world_size"] == 2
    assert "wandb sync" in proc.stdout + proc.stderr  # offline, and how to sync later


def test_a_preempted_run_resumes_the_same_runs_without_repeating_steps(tmp_path):
    env = tool_environment(tmp_path / "home")
    run = tmp_path / "run"
    flags = ["--epochs", "3", "--tracker", "tensorboard,wandb", "--log-every", "5", "--checkpoint-every", "8steps"]
    cmd = [sys.executable, "-m", "shoal", "train", "digits", "--nproc", "2", "--device", "cpu", "--out", str(run)]
    first = start_cmd(*cmd, *flags, env=env)
    try:
        wait_for(lambda: len(checkpoints(run / "checkpoints")) >= 3 or first.poll() is not None, timeout=240)
        assert first.poll() is None, "finished before it could be preempted"
        first.send_signal(signal.SIGTERM)  # the launcher forwards it; every rank checkpoints and stops
        out, err = first.communicate(timeout=120)
    finally:
        kill_group(first)
    assert first.returncode == 128 + signal.SIGTERM, out + err
    second = _train(run, env, *flags)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resuming from" in second.stdout
    loss = tb_series(tensorboard(run / "tensorboard"), "train/loss")  # raises on a step logged twice
    assert sorted(loss) == list(range(5, 3 * STEPS_PER_EPOCH + 1, 5))
    runs = wandb_runs(run, env)
    assert len(runs) == 2 and len({r.run_id for r in runs}) == 1  # two attempts, one W&B run
