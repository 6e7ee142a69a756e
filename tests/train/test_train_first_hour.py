"""``shoal train --nproc 2`` into an existing run, and stopped: what it says, line by line (issue 38).

A run directory that cannot be resumed, or that has nothing left to do, is judged from its files
before any worker starts; a stopped run with checkpoints says that the same command resumes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

import warm
from conftest import run_shoal, shoal_cmd
from procs import wait_for

TRAIN = ("train", "digits", "--epochs", "1", "--device", "cpu")


def _finished_run(out, *, checkpoint: bool) -> dict[str, bytes]:
    """The files a finished one-epoch run leaves (contents do not matter to the check)."""
    out.mkdir()
    (out / "config.json").write_text('{"workload": "digits"}\n')
    (out / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "test_accuracy": 0.9}) + "\n")
    (out / "model.pt").write_bytes(b"weights")
    if checkpoint:
        (out / "checkpoints").mkdir()
        (out / "checkpoints" / "ckpt-e00001-s000000023.pt").write_bytes(b"state")
    return {str(p): p.read_bytes() for p in out.rglob("*") if p.is_file()}


@pytest.mark.parametrize("nproc", ["1", "2"])
def test_a_finished_run_without_checkpoints_is_refused_before_any_worker_starts(tmp_path, nproc):
    out = tmp_path / "run"
    before = _finished_run(out, checkpoint=False)
    result = run_shoal(*TRAIN, "--nproc", nproc, "--out", str(out), env={"TMPDIR": str(tmp_path)})
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"shoal: error: output directory {out} already holds a finished run; it was left untouched",
        "HINT: pass a new --out DIR, or delete the old run first",
    ]
    assert result.stdout == ""
    assert {str(p): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert not list(tmp_path.glob("shoal-workers-*")), "workers were started"


@pytest.mark.parametrize("nproc", ["1", "2"])
def test_a_complete_run_says_only_that_it_is_complete(tmp_path, nproc):
    out = tmp_path / "run"
    before = _finished_run(out, checkpoint=True)
    result = run_shoal(*TRAIN, "--nproc", nproc, "--out", str(out), env={"TMPDIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert (result.stdout + result.stderr).splitlines() == [
        f"shoal: the run in {out} is already complete (1 epoch): nothing to do"
    ]
    assert {str(p): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert not list(tmp_path.glob("shoal-workers-*")), "workers were started"


@pytest.mark.multiprocess
def test_ctrl_c_names_the_command_and_says_the_same_command_resumes(tmp_path):
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "SHOAL_ENV"}
    cmd = shoal_cmd("train", "digits", "--nproc", "2", "--epochs", "200", "--device", "cpu", "--out", str(out))
    proc = warm.popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path, start_new_session=True
    )
    try:
        wait_for(lambda: list(out.glob("checkpoints/ckpt-*.pt")), timeout=180, what="the first checkpoint")
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGINT, stderr
    # The banner names what the user ran, not torchrun (whose variables the workers see).
    assert stdout.splitlines()[0].startswith(
        "shoal train digits: rank 0/2 (local 0/2, node 0/1) via shoal train on cpu [gloo]"
    ), stdout
    newest = sorted(out.glob("checkpoints/ckpt-*.pt"))[-1]
    assert stderr.splitlines()[-2:] == [
        "shoal: stopped by SIGINT; workers stopped",
        f"shoal: run the same command again to resume from {newest}",
    ], stderr
