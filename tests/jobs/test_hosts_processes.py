"""``run_launchers`` and ``supervise_mpirun`` (:mod:`shoal.jobs.hosts.processes`) and the per-rank status
wrapper (:mod:`shoal.jobs.hosts.rank_status`): real processes; which host's or rank's status is reported."""

from __future__ import annotations

import os
import shutil
import sys
import time

import pytest

import warm
from shoal.errors import EXIT_ANOTHER_NODE_FAILED
from shoal.jobs.hosts import processes as remote
from shoal.jobs.hosts import rank_status
from shoal.jobs.hosts.options import Here, HostsOptions
from shoal.jobs.hosts.render import render_mpirun
from shoal.jobs.spec import JobSpec


def _sh(script: str) -> list[str]:
    return ["sh", "-c", script]


def test_the_cause_is_reported_even_when_its_consequence_ends_first(capsys):
    # Host a only saw another node end the job and exits at once; host b, the cause, a moment later.
    status = remote.run_launchers(
        [_sh(f"exit {EXIT_ANOTHER_NODE_FAILED}"), _sh("sleep 1; exit 3")], ["host a", "host b"]
    )
    assert status == 3
    assert "shoal launch: host b exited with status 3" in capsys.readouterr().err


def test_a_consequence_alone_is_reported_after_the_settle_time(capsys, monkeypatch):
    monkeypatch.setattr(remote, "SETTLE_S", 0.5)
    monkeypatch.setattr(remote, "GRACE_S", 2.0)  # sleep ignores its stdin closing: killed after the grace
    started = time.monotonic()
    status = remote.run_launchers([_sh(f"exit {EXIT_ANOTHER_NODE_FAILED}"), _sh("exec sleep 60")], ["host a", "host b"])
    elapsed = time.monotonic() - started
    assert status == EXIT_ANOTHER_NODE_FAILED
    assert 0.5 <= elapsed < 10  # waited SETTLE_S for a cause, then stopped host b instead of waiting for it
    assert "host a exited with status 75; stopping the other hosts" in capsys.readouterr().err


def test_a_real_failure_stops_the_others_at_once(capsys, monkeypatch):
    monkeypatch.setattr(remote, "GRACE_S", 2.0)  # sleep ignores its stdin closing: killed after the grace
    started = time.monotonic()
    status = remote.run_launchers([_sh("exit 4"), _sh("exec sleep 60")], ["host a", "host b"])
    assert status == 4 and time.monotonic() - started < 10
    assert "host a exited with status 4; stopping the other hosts" in capsys.readouterr().err


def test_all_succeed():
    assert remote.run_launchers([_sh("exit 0"), _sh("sleep 0.2")], ["host a", "host b"]) == 0


# ---- mpirun: each rank's status comes back, and the rank with the cause is named ------------------

needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed")


def _mpirun_argv(script: str, np: int = 2) -> list[str]:
    spec = JobSpec(command=("sh", "-c", script), python=sys.executable)
    return render_mpirun(spec, HostsOptions(np=np), Here.detect(), report_status=True)


def test_rank_status_reports_the_command_status(capfd):
    assert rank_status.main(["--", "sh", "-c", "exit 7"]) == 7
    assert rank_status.main(["--", "/nonexistent/program"]) == 127
    err = capfd.readouterr().err
    assert f"{rank_status.STATUS_MARKER} rank=0 status=7" in err and "status=127" in err


@needs_mpirun
def test_mpirun_reports_the_cause_even_when_a_consequence_ends_first(capfd):
    script = 'if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then exit 75; fi; sleep 1; exit 4'
    assert remote.supervise_mpirun(_mpirun_argv(script), ranks=["here", "here"]) == 4
    err = capfd.readouterr().err
    assert "shoal launch: rank 1 on here exited with status 4" in err and "rank=" not in err


@needs_mpirun
def test_mpirun_reports_a_consequence_alone_after_the_settle_time_and_stops_the_rest(tmp_path, capfd, monkeypatch):
    monkeypatch.setattr(remote, "SETTLE_S", 1.0)
    pid_file = tmp_path / "sleeper.pid"
    script = f'if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then exit 75; fi; echo $$ > {pid_file}; exec sleep 600'
    started = time.monotonic()
    assert remote.supervise_mpirun(_mpirun_argv(script), ranks=["a", "b"]) == EXIT_ANOTHER_NODE_FAILED
    assert time.monotonic() - started < 60
    assert "rank 0 on a exited with status 75 (stopped because another rank failed" in capfd.readouterr().err
    sleeper = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{sleeper}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{sleeper}"), "the waiting rank was left running"


@needs_mpirun
def test_mpirun_all_ranks_succeed():
    assert remote.supervise_mpirun(_mpirun_argv("exit 0"), ranks=["a", "b"]) == 0


@needs_mpirun
def test_the_rank_wrapper_starts_without_a_warning_on_every_rank(tmp_path):
    """``python -m shoal.jobs.hosts.rank_status`` found itself imported by its own package (runpy's
    RuntimeWarning, once per rank, in every ``shoal launch --via mpirun`` job's output)."""

    proc = warm.run(
        [sys.executable, "-m", "shoal", "launch", "--hosts", "localhost:2", "--via", "mpirun", "--", "sh", "-c", "true"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr and "Warning" not in proc.stdout, proc.stderr
