"""``shoal status RUN_DIR`` from another process, on a live 2-rank gloo job, a hung one and a finished one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import warm
from procs import wait_for
from progress_job import start_job, stop_job
from shoal.progress import read_progress


def status(*args: str) -> subprocess.CompletedProcess:
    return warm.run([sys.executable, "-m", "shoal", "status", *args], capture_output=True, text=True, timeout=120)


def _stepping(progress, steps=3):
    ranks = read_progress(progress)
    return len(ranks) == 2 and all(r.steps_timed >= steps for r in ranks)


@pytest.mark.multiprocess
def test_status_of_a_live_job_rows_json_and_stacks(tmp_path):
    progress = tmp_path / "progress"
    (tmp_path / "checkpoints").mkdir()
    for name in ("ckpt-e00001-s000000010.pt", "ckpt-e00002-s000000020.pt", "ckpt-e00003-s000000030.pt.tmp-1"):
        (tmp_path / "checkpoints" / name).write_bytes(b"")
    procs = start_job(progress)
    try:
        wait_for(lambda: _stepping(progress), timeout=120)
        proc = status(str(tmp_path))
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert lines[0].split()[:4] == ["rank", "pid", "node", "step"]
        rows = [line.split() for line in lines[1:3]]
        assert [(int(r[0]), int(r[1])) for r in rows] == [(0, procs[0].pid), (1, procs[1].pid)]
        assert "last checkpoint: ckpt-e00002-s000000020.pt" in lines
        assert "verdict: running" in lines

        payload = json.loads(status(str(tmp_path), "--json").stdout)
        assert [r["rank"] for r in payload["ranks"]] == [0, 1]
        assert all(r["step"] >= 3 and r["samples_per_s"] > 0 and r["alive"] for r in payload["ranks"])
        assert payload["verdict"]["state"] == "running"

        proc = status(str(progress), "--stacks")  # the progress directory itself works too
        assert proc.returncode == 0, proc.stderr
        assert "--- rank 0 stack ---" in proc.stdout and "--- rank 1 stack ---" in proc.stdout
        assert proc.stdout.count("progress_worker.py") >= 2
        assert all(p.poll() is None for p in procs)  # the dump stops nobody
    finally:
        stop_job(procs)


@pytest.mark.multiprocess
def test_status_of_a_hung_job_says_hung_and_of_a_finished_one_finished(tmp_path):
    progress = tmp_path / "progress"
    procs = start_job(progress, HANG_RANK="1", HANG_STEP="3")
    try:
        wait_for(lambda: [r.phase for r in read_progress(progress)] == ["collective", "data"], timeout=120)
        # A hang is declared after 30 s (the floor); status says so without waiting: state stays
        # "running" until then, and the phases show where each rank is.
        payload = json.loads(status(str(tmp_path), "--json").stdout)
        assert [r["phase"] for r in payload["ranks"]] == ["collective #4", "data"]
        assert payload["verdict"]["state"] == "running"
    finally:
        stop_job(procs)
    payload = json.loads(status(str(tmp_path), "--json").stdout)
    assert payload["verdict"]["state"] == "exited" and payload["verdict"]["ranks"] == [0, 1]

    finished = tmp_path / "finished"
    procs = start_job(finished / "progress", STEPS="3")
    try:
        assert [p.wait(timeout=120) for p in procs] == [0, 0]
    finally:
        stop_job(procs)
    proc = status(str(finished))
    assert "verdict: finished" in proc.stdout.splitlines(), proc.stdout


def test_status_of_a_directory_without_progress_files_is_one_error_and_a_hint(tmp_path):
    for target in (tmp_path, tmp_path / "missing"):
        proc = status(str(target))
        assert proc.returncode == 2
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 2 and lines[0].startswith("shoal: error: ") and lines[1].startswith("HINT: ")
        assert proc.stdout == ""


def test_status_declares_a_hang_once_no_rank_moved_past_the_timeout(tmp_path, monkeypatch):
    # A rank (this test process: its pid is alive) whose last phase change was 100 s ago.
    from shoal.progress import ProgressWriter

    writer = ProgressWriter(tmp_path / "progress", 0, stacks=False)
    real = time.monotonic
    with monkeypatch.context() as patch:
        patch.setattr(time, "monotonic", lambda: real() - 100)
        writer.phase("data", 5)
    payload = json.loads(status(str(tmp_path), "--json").stdout)
    assert payload["verdict"]["state"] == "hung"
    assert payload["verdict"]["text"].startswith("hung: no rank made progress for 10")
    assert payload["ranks"][0]["in_phase_s"] >= 100
    writer.close()


def test_status_help_imports_no_torch():
    probe = (
        "import sys\nfrom shoal.cli.main import main\ntry:\n    main(['status', '--help'])\n"
        "except SystemExit:\n    pass\nprint('torch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.stdout.splitlines()[-1] == "False" and "examples:" in proc.stdout


def test_status_without_a_run_dir_finds_the_one_running_temporary_run(tmp_path, monkeypatch):
    # shoal run without --log-dir: its run directory is a temporary shoal-run-*; only runs with a
    # live rank count (this test process writes the record: its pid is alive).
    import tempfile

    from shoal.cli.status import find_run_dir, running_jobs
    from shoal.errors import ShoalError
    from shoal.progress import ProgressWriter

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # no ./runs here either
    with pytest.raises(ShoalError, match="no running job found"):
        find_run_dir(None)
    finished = ProgressWriter(tmp_path / "shoal-run-old" / "progress", 0, stacks=False)
    finished.close()
    live = ProgressWriter(tmp_path / "shoal-run-abc" / "progress", 0, stacks=False)
    try:
        assert running_jobs() == [tmp_path / "shoal-run-abc"] and find_run_dir(None) == tmp_path / "shoal-run-abc"
        other = ProgressWriter(tmp_path / "shoal-workers-xyz" / "progress", 0, stacks=False)
        with pytest.raises(ShoalError, match="2 running jobs"):
            find_run_dir(None)
        other.close()
        assert find_run_dir("runs/x") == Path("runs/x")
    finally:
        live.close()


def _record_of_a_dead_rank(progress: Path) -> None:
    """A rank that stepped, then died without saying it was done (its pid no longer runs)."""
    code = (
        "import os, sys\nfrom shoal.progress import ProgressWriter\n"
        "w = ProgressWriter(sys.argv[1], 0, stacks=False)\nw.phase('data', 3)\nos._exit(0)"
    )
    subprocess.run([sys.executable, "-c", code, str(progress)], check=True, timeout=60)


def status_in(directory: Path) -> subprocess.CompletedProcess:
    """``shoal status`` with no argument, run in ``directory`` with ``directory/tmp`` as TMPDIR."""
    env = {**os.environ, "TMPDIR": str(directory / "tmp")}
    return warm.run(
        [sys.executable, "-m", "shoal", "status"], capture_output=True, text=True, timeout=120, cwd=directory, env=env
    )


def test_status_without_a_run_dir_shows_the_newest_run_in_runs(tmp_path):
    # Nothing running on this machine: `shoal train` without --out keeps its runs in ./runs.
    (tmp_path / "tmp").mkdir()
    proc = status_in(tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"shoal: error: no running job found in {tmp_path / 'tmp'} (shoal-run-*) and no run in ./runs",
        "HINT: pass the run directory: shoal train's --out DIR, or shoal run's --log-dir DIR (without it, a "
        "shoal run keeps its progress in a temporary directory only while it runs)",
    ]
    for day in ("01", "02"):
        _record_of_a_dead_rank(tmp_path / "runs" / f"digits-202601{day}-000000" / "progress")
    for old in (tmp_path / "runs" / "digits-20260101-000000" / "progress").iterdir():
        os.utime(old, (time.time() - 3600, time.time() - 3600))  # the older run's records: an hour ago
    proc = status_in(tmp_path)
    # A run whose ranks died before finishing (killed) is not a success: exit status 1.
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "run: runs/digits-20260102-000000"
    assert lines[1].split()[:4] == ["rank", "pid", "node", "step"]
    assert lines[-1] == "verdict: rank 0 exited before finishing"


def test_status_of_a_missing_directory_names_the_real_flags(tmp_path):
    proc = status(str(tmp_path / "missing"))
    assert proc.stderr.splitlines() == [
        f"shoal: error: no run directory {tmp_path / 'missing'}",
        "HINT: pass the run directory of a job: shoal train's --out, or shoal run's --log-dir",
    ]


def test_a_record_from_another_node_is_not_judged_by_a_pid_of_this_one(tmp_path):
    """On a shared --out, another node's ranks write records whose pids are that node's: a pid that
    does not exist here says nothing (its own launcher watches it). Each record is written by a real
    process that then dies without closing it, so its pid is gone on this machine; only the one
    written on this node counts as exited."""
    writer = (
        "import os, sys\nfrom shoal.progress import ProgressWriter\n"
        "w = ProgressWriter(sys.argv[1], int(sys.argv[2]), stacks=False)\nw.phase('forward', 3)\nos._exit(0)"
    )
    progress = tmp_path / "progress"
    # 192.0.2.7: a documentation address (RFC 5737), never this machine's; node-b: a name not this host's.
    for rank, node_name in enumerate(("192.0.2.7", "node-b")):
        env = {**os.environ, "SHOAL_NODE_NAME": node_name}
        subprocess.run([sys.executable, "-c", writer, str(progress), str(rank)], env=env, check=True, timeout=120)
    payload = json.loads(status(str(tmp_path), "--json").stdout)
    assert [(r["node"], r["alive"]) for r in payload["ranks"]] == [("192.0.2.7", True), ("node-b", True)]
    assert payload["verdict"]["state"] == "running", payload["verdict"]

    env = {k: v for k, v in os.environ.items() if k != "SHOAL_NODE_NAME"}  # this node: its host name
    subprocess.run([sys.executable, "-c", writer, str(progress), "2"], env=env, check=True, timeout=120)
    proc = status(str(tmp_path), "--json")
    payload = json.loads(proc.stdout)
    assert [r["alive"] for r in payload["ranks"]] == [True, True, False]
    assert payload["verdict"]["text"] == "rank 2 exited before finishing" and proc.returncode == 1


@pytest.mark.multiprocess
def test_status_finds_a_running_shoal_run_whose_script_reports_no_progress(tmp_path):
    """Issue 49: a plain script under ``shoal run`` (no --log-dir) writes no progress record; ``shoal
    status`` still finds its temporary run directory (the launcher's pid runs), says the job runs and
    that the script reports no progress, and names ctx.progress() in the HINT."""
    (tmp_path / "tmp").mkdir()
    script = tmp_path / "plain.py"
    script.write_text("import sys, time\nprint('started', flush=True)\ntime.sleep(120)\n")
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    env.pop("SHOAL_ENV", None)
    job = warm.popen(
        [sys.executable, "-m", "shoal", "run", "--nproc", "2", str(script)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert job.stdout.readline() == "started\n"  # a worker runs the script
        (run_dir,) = (tmp_path / "tmp").glob("shoal-run-*")
        hint = (
            "HINT: to see each rank's step and phase here, open this rank's progress in the script: ctx = "
            "shoal.init(); progress = ctx.progress(); then progress.step_done(...) after each step "
            "(docs/WATCHDOG.md)"
        )
        proc = status_in(tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.splitlines() == [
            f"run: {run_dir}",
            f"verdict: running (launcher pid {job.pid}); the script reports no progress, so no rank's step or "
            "phase to show",
            hint,
        ]
        given = status(str(run_dir), "--json")
        report = json.loads(given.stdout)
        assert (report["ranks"], report["verdict"]["state"], report["verdict"]["progress"]) == ([], "running", False)
        assert report["verdict"]["launcher_pid"] == job.pid and "ctx.progress()" in report["hint"]
    finally:
        job.terminate()
        job.wait(timeout=60)
    # The launcher gone (its run directory with it): nothing running here any more.
    proc = status_in(tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("shoal: error: no running job found"), proc.stderr
