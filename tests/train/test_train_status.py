"""``shoal train --nproc`` puts the watchdog's progress records in its run directory, where
``shoal status RUN_DIR`` reads them (issue 22)."""

import json
import subprocess
import sys

import pytest

import warm


@pytest.mark.multiprocess
def test_shoal_status_reads_a_finished_trains_run_directory(tmp_path):
    out = tmp_path / "run"
    train = [sys.executable, "-m", "shoal", "train", "digits", "--nproc", "2", "--epochs", "1", "--out", str(out)]
    done = warm.run(train, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in (out / "progress").glob("rank-*.progress")) == ["rank-0.progress", "rank-1.progress"]
    status = warm.run(
        [sys.executable, "-m", "shoal", "status", str(out), "--json"], capture_output=True, text=True, timeout=60
    )
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["verdict"]["state"] == "finished" and report["last_checkpoint"] == "ckpt-e00001-s000000023.pt"
    ranks = report["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["phase"] == "done" and r["step"] == ranks[0]["step"] > 0 for r in ranks)


@pytest.mark.multiprocess
def test_a_run_directory_under_home_is_expanded_once_for_every_worker(tmp_path):
    """``shoal.fit(out="~/...")``: the launcher names, prepares and expands it; the workers write
    the model and the checkpoints there (not under a literal ``~`` in the working directory)."""
    script = "import shoal; shoal.fit('digits', epochs=1, nproc=2, out='~/runs/d', progress=False)"
    env = {"HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run = tmp_path / "home" / "runs" / "d"
    assert (run / "model.pt").is_file() and list((run / "checkpoints").glob("ckpt-*.pt"))
    assert not (tmp_path / "~").exists()
