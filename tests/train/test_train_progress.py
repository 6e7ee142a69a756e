"""The trainer on the progress channel (issue 22): its phases and steps in the per-rank records, and
the watchdog's stragglers in the epoch records (metrics.jsonl, the trackers)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import warm
from shoal.progress import ENV_DIR, VERDICT_FILE, ProgressWriter, read_progress, write_verdict
from shoal.train.config import TrainConfig
from shoal.train.reporting import Reports

LINE = "shoal: rank 1 (node vm) straggles: 30.2 ms of compute per step vs 10.2 ms for the others (2.97x)"


class _Tracker:
    names = ("fake",)
    enabled = True

    def __init__(self) -> None:
        self.epochs: list[dict] = []

    def log_epoch(self, record, *, step):
        self.epochs.append(dict(record))


def _reports(tmp_path: Path, rank: int = 0) -> Reports:
    ctx = SimpleNamespace(
        rank=rank, is_main=rank == 0, device=torch.device("cpu"), progress=lambda: ProgressWriter(None)
    )
    return Reports(TrainConfig(), ctx, tmp_path)


def test_rank_0_reads_the_watchdogs_stragglers_once_per_epoch(tmp_path, monkeypatch):
    reports = _reports(tmp_path)
    monkeypatch.delenv(ENV_DIR, raising=False)
    assert reports.stragglers() == []  # no watchdog
    monkeypatch.setenv(ENV_DIR, str(tmp_path / "progress"))
    assert reports.stragglers() == []  # no verdict yet
    write_verdict(tmp_path / "progress" / VERDICT_FILE, [], None)
    assert reports.stragglers() == []  # a verdict without stragglers
    stragglers = [
        {"rank": 1, "node": "vm", "ratio": 2.97, "line": LINE},
        {"rank": 3, "node": "n1", "ratio": 1.5, "line": "x"},
    ]
    write_verdict(tmp_path / "progress" / VERDICT_FILE, stragglers, None)
    assert reports.stragglers() == [LINE, "x"]
    assert _reports(tmp_path, rank=1).stragglers() == []  # rank 0 reads; the others have nothing to do
    (tmp_path / "progress" / VERDICT_FILE).write_text('{"stragglers": [{"rank": 1}]')  # torn: not ours to fail on
    assert reports.stragglers() == []


def test_stragglers_go_to_the_trackers_as_a_count(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    reports = _reports(tmp_path)
    reports.tracker, reports.every = _Tracker(), 1
    model = torch.nn.Linear(2, 2)
    reports.epoch({"epoch": 1, "train_loss": 1.0}, 10, model, None, None, None)
    write_verdict(tmp_path / VERDICT_FILE, [{"rank": 1, "node": "vm", "ratio": 2.0, "line": LINE}], None)
    record = {"epoch": 2, "train_loss": 0.5}
    lines = reports.stragglers()
    if lines:
        record["stragglers"] = lines
    reports.epoch(record, 20, model, None, None, None)
    write_verdict(tmp_path / VERDICT_FILE, [], None)
    assert reports.stragglers() == []
    reports.epoch({"epoch": 3, "train_loss": 0.4}, 30, model, None, None, None)
    # No count before the first straggler; its number while there; 0 once it is gone. The lines
    # themselves are in metrics.jsonl (the trackers take numbers).
    assert reports.tracker.epochs == [
        {"epoch": 1, "train_loss": 1.0},
        {"epoch": 2, "train_loss": 0.5, "stragglers": 1},
        {"epoch": 3, "train_loss": 0.4, "stragglers": 0},
    ]


@pytest.mark.multiprocess
def test_the_trainers_records_and_the_verdict_in_metrics(tmp_path):
    """2 ranks under torchrun (no shoal launcher: the progress directory is the one given here, and
    nobody clears it): each rank's record counts every step and sample and ends in ``done``; a
    verdict naming a straggler, as the watchdog writes it, is in every epoch's record."""
    progress = tmp_path / "progress"
    write_verdict(progress / VERDICT_FILE, [{"rank": 1, "node": "vm", "ratio": 2.97, "line": LINE}], None)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SHOAL_ENV")}
    env[ENV_DIR] = str(progress)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "shoal"]
    cmd += ["train", "digits", "--device", "cpu", "--epochs", "2", "--out", str(tmp_path / "run"), "--no-progress"]
    result = warm.run(cmd, capture_output=True, text=True, env=env, timeout=240, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    records = read_progress(progress)
    assert [r.rank for r in records] == [0, 1]
    steps = 2 * 23  # 1,440 samples / (32 x 2) per epoch, the last batch short
    for record in records:
        assert record.phase == "done" and record.world_size == 2
        assert record.steps_timed == steps and record.step == steps
        assert record.total_samples == 1440  # this rank's half of 2 epochs
        # one agreement on preemption per step, the epochs' loss sums and checkpoints' tallies
        assert record.collectives >= steps + 2
        assert record.total_compute_s > 0 and record.total_wait_s > 0
    epochs = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [record["stragglers"] for record in epochs] == [[LINE], [LINE]]
