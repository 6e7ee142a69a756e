"""``shoal train`` SIGKILLed right after epoch 4's checkpoint and resumed: every epoch's test
accuracy is in TensorBoard exactly once (issue 19 saw epochs 1, 2, 3, 5, 6: epoch 4's lost)."""

from __future__ import annotations

import json
import signal
import sys

import pytest

import warm
from procs import kill_group, start_cmd, wait_for
from tracking.harness import tool_environment
from tracking.readers import tb_series, tensorboard

pytestmark = pytest.mark.multiprocess

STEPS_PER_EPOCH = 23  # digits: 1,440 training images, 2 workers x batch 32
EPOCHS, KILLED_AFTER = 6, 4


def test_every_epoch_once_after_a_kill_right_after_an_epoch_checkpoint(tmp_path):
    env = tool_environment(tmp_path / "home")
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "shoal", "train", "digits", "--nproc", "2", "--device", "cpu", "--out", str(run)]
    flags = ["--epochs", str(EPOCHS), "--tracker", "tensorboard", "--checkpoint-every", "1", "--keep", "10"]
    first = start_cmd(*cmd, *flags, env=env)
    saved = run / "checkpoints" / f"ckpt-e{KILLED_AFTER:05d}-s{KILLED_AFTER * STEPS_PER_EPOCH:09d}.pt"
    try:
        wait_for(lambda: saved.exists() or first.poll() is not None, timeout=240, interval=0.005)
        assert first.poll() is None, "finished before it could be killed"
    finally:
        kill_group(first, signal.SIGKILL)
        first.communicate(timeout=60)
    second = warm.run([*cmd, *flags], capture_output=True, text=True, timeout=300, env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resuming from" in second.stdout
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in metrics] == list(range(1, EPOCHS + 1))
    accuracy = tb_series(tensorboard(run / "tensorboard"), "epoch/test_accuracy")  # raises on a step twice
    assert accuracy == pytest.approx({STEPS_PER_EPOCH * m["epoch"]: m["test_accuracy"] for m in metrics})
