"""SIGTERM -> grace -> SIGKILL on real processes: one that stops when asked, one that ignores SIGTERM,
one already gone."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from procs import wait_for
from shoal.stopping import stop_with_grace

SIGTERM_BIT = 1 << (15 - 1)  # /proc/PID/status SigIgn: bit N-1 for signal N


def _ignores_sigterm(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    ignored = next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:"))
    return bool(int(ignored, 16) & SIGTERM_BIT)


def test_asks_each_running_target_and_kills_only_the_one_still_there_after_the_grace():
    polite = subprocess.Popen(["sleep", "60"])
    stubborn = subprocess.Popen(["sh", "-c", 'trap "" TERM; exec sleep 60'])
    gone = subprocess.Popen(["true"])
    procs = [polite, stubborn, gone]
    asked: list[int] = []
    try:
        gone.wait(timeout=10)
        wait_for(lambda: _ignores_sigterm(stubborn.pid), timeout=10, what="sh's trap set before the exec")

        def ask(proc: subprocess.Popen) -> None:
            asked.append(proc.pid)
            proc.terminate()

        started = time.monotonic()
        killed = stop_with_grace(
            procs, running=lambda p: p.poll() is None, ask=ask, kill=subprocess.Popen.kill, grace_s=1.0
        )
        elapsed = time.monotonic() - started
        assert killed == [stubborn]
        assert asked == [polite.pid, stubborn.pid]  # the process already gone is not signalled
        assert (polite.returncode, stubborn.returncode) == (-15, -9)
        assert 1.0 <= elapsed < 5.0  # the grace was given in full, and no more than needed after the kill
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_nothing_to_stop_returns_at_once():
    started = time.monotonic()
    assert stop_with_grace([], running=bool, ask=print, kill=print, grace_s=30.0) == []
    assert time.monotonic() - started < 1.0
