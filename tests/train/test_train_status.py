"""``shoal train --nproc`` puts the watchdog's progress records in its run directory, where
``shoal status RUN_DIR`` reads them (issue 22)."""

import json
import subprocess
import sys

import pytest


@pytest.mark.multiprocess
def test_shoal_status_reads_a_finished_trains_run_directory(tmp_path):
    out = tmp_path / "run"
    train = [sys.executable, "-m", "shoal", "train", "digits", "--nproc", "2", "--epochs", "1", "--out", str(out)]
    done = subprocess.run(train, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in (out / "progress").glob("rank-*.progress")) == ["rank-0.progress", "rank-1.progress"]
    status = subprocess.run(
        [sys.executable, "-m", "shoal", "status", str(out), "--json"], capture_output=True, text=True, timeout=60
    )
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["verdict"]["state"] == "finished" and report["last_checkpoint"] == "ckpt-e00001-s000000023.pt"
    ranks = report["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["phase"] == "done" and r["step"] == ranks[0]["step"] > 0 for r in ranks)
