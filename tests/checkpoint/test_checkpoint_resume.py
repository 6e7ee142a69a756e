"""Exact resume of ``shoal train``: killed, restarted, preempted, resumed on another world size.

Every interrupted run must end with final weights bit-identical to an uninterrupted run with the
same seed and world size (CPU, gloo): the checkpoint holds everything that decides the rest.
"""

from __future__ import annotations

import json
import re
import signal

import pytest
import torch

from conftest import run_shoal
from procs import alive, checkpoints, kill_group, start, wait_for, workers

pytestmark = pytest.mark.multiprocess

# 4 epochs of digits on 2 workers (92 steps): time enough to interrupt after the first checkpoint.
RUN = ["train", "digits", "--device", "cpu", "--epochs", "4", "--seed", "5", "--checkpoint-every", "7steps"]


def _weights(out):
    return torch.load(out / "model.pt", weights_only=True)


def _assert_identical(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run (2 workers)."""
    out = tmp_path_factory.mktemp("reference") / "run"
    result = run_shoal(*RUN, "--nproc", "2", "--out", str(out), timeout=300)
    assert result.returncode == 0, result.stderr
    return out


def _interrupted_start(out, *extra):
    proc = start(*RUN, "--nproc", "2", "--out", str(out), *extra)
    wait_for(lambda: len(checkpoints(out / "checkpoints")) >= 1 or proc.poll() is not None)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    return proc


def test_killed_run_restarted_by_hand_is_bit_identical(reference, tmp_path):
    out = tmp_path / "run"
    proc = _interrupted_start(out)
    kill_group(proc, signal.SIGKILL)  # the whole node dies: launcher and workers
    proc.communicate(timeout=60)
    assert not (out / "model.pt").exists()
    again = run_shoal(*RUN, "--nproc", "2", "--out", str(out), timeout=300)
    assert again.returncode == 0, again.stderr
    assert "resuming from" in again.stdout
    _assert_identical(_weights(out), _weights(reference))
    assert [m["epoch"] for m in _metrics(out)] == list(range(1, 5))
    assert [m["test_accuracy"] for m in _metrics(out)] == [m["test_accuracy"] for m in _metrics(reference)]


def test_worker_killed_elastic_restart_resumes_bit_identical(reference, tmp_path):
    out = tmp_path / "run"
    proc = _interrupted_start(out, "--max-restarts", "1")
    victims = workers(proc.pid)
    assert len(victims) == 2
    import os

    os.kill(victims[1], signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert "resuming from" in stdout
    _assert_identical(_weights(out), _weights(reference))
    assert all(m["samples_seen"] == 1440 for m in _metrics(out))


def test_sigterm_to_launcher_checkpoints_and_exits_then_resumes(reference, tmp_path):
    out = tmp_path / "run"
    proc = _interrupted_start(out)
    pids = workers(proc.pid)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "preempted by SIGTERM" in stderr and "run the same command again to resume" in stderr
    assert not any(alive(pid) for pid in pids)
    newest = checkpoints(out / "checkpoints")[-1]
    # What a user sees is shoal's own lines, each whole and once: no torch agent log, no traceback.
    # (A loaded machine may also get the watchdog's straggler line, which is shoal's and legitimate.)
    lines = [line for line in stderr.splitlines() if line.strip() and " straggles: " not in line]
    stopped_at = re.search(r"preempted by SIGTERM in epoch (\d+) after step (\d+);", stderr)
    assert stopped_at, stderr
    assert lines == [
        "shoal: received SIGTERM: checkpointing after this step, then exiting",
        f"shoal: error: preempted by SIGTERM in epoch {stopped_at[1]} after step {stopped_at[2]}; "
        f"checkpoint saved to {newest}",
        f"HINT: run the same command again to resume (--resume auto finds the newest checkpoint in {out})",
        "shoal: stopped by SIGTERM; workers stopped",
    ], stderr
    again = run_shoal(*RUN, "--nproc", "2", "--out", str(out), timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"resuming from {newest}" in again.stdout
    _assert_identical(_weights(out), _weights(reference))


@pytest.mark.parametrize("first, second", [(2, 1), (1, 3)])
def test_resume_on_another_world_size_sees_every_sample_once(tmp_path, first, second):
    """SIGUSR1 to one worker mid-epoch; resume with another world size; lr follows the rule."""
    out = tmp_path / "run"
    common = [*RUN[:-4], "--epochs", "3", "--lr-scaling", "linear", "--checkpoint-every", "7steps"]
    proc = start(*common, "--nproc", str(first), "--out", str(out))
    wait_for(lambda: len(checkpoints(out / "checkpoints")) >= 1 or proc.poll() is not None)
    assert proc.poll() is None
    target = workers(proc.pid)[-1] if first > 1 else proc.pid
    import os

    os.kill(target, signal.SIGUSR1)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGUSR1, stderr
    assert "preempted by SIGUSR1" in stderr
    again = run_shoal(*common, "--nproc", str(second), "--out", str(out), timeout=300)
    assert again.returncode == 0, again.stderr
    metrics = _metrics(out)
    assert [m["epoch"] for m in metrics] == list(range(1, 4))
    assert all(m["samples_seen"] == 1440 for m in metrics), [m["samples_seen"] for m in metrics]
    assert f"lr {0.05 * second:g} (base 0.05)" in again.stdout
    assert metrics[-1]["world_size"] == second and metrics[-1]["test_accuracy"] > 0.9


def test_resume_from_a_given_checkpoint_file_into_a_new_run(reference, tmp_path):
    """--resume PATH continues another run's checkpoint in a new output directory."""
    source = checkpoints(reference / "checkpoints")[0]
    out = tmp_path / "continued"
    result = run_shoal(*RUN, "--nproc", "2", "--out", str(out), "--resume", str(source), timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"resuming from {source}" in result.stdout
    _assert_identical(_weights(out), _weights(reference))
    bad = run_shoal(*RUN, "--out", str(tmp_path / "x"), "--resume", str(tmp_path / "nope.pt"))
    assert bad.returncode != 0 and "no such checkpoint" in bad.stderr and "HINT:" in bad.stderr
