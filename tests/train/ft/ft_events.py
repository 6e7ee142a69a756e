"""Read what a fault-tolerant run's groups said: ``replicas.jsonl`` in its run directory, one event
a line (``start``, ``joined``, ``quorum``, ``healed``, ``finished``...) with group, pid, step, time;
and the fault the tests share: SIGKILL group 1 after its first commit, let the job finish."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import procs


def events(out: Path) -> list[dict]:
    path = out / "replicas.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def kill_group_one(
    proc: subprocess.Popen, out: Path, victim: Callable[[int], int] = lambda pid: pid, timeout: float = 240.0
) -> tuple[int, float, str, str]:
    """Wait for group 1's first commit in ``out``, SIGKILL ``victim(pid of group 1's rank 0)``, and
    wait for the job ``proc`` (started with pipes) to end: ``(pid killed, when, stdout, stderr)``.
    ``proc``'s session is killed whatever happens."""
    try:
        procs.wait_for(
            lambda: find(events(out), 1, "joined"), timeout=240, what="group 1's first commit",
            unless=lambda: proc.poll() is not None,
        )  # fmt: skip
        pid = victim(find(events(out), 1, "start")[0]["pid"])
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        procs.kill_group(proc)
    return pid, killed_at, stdout, stderr


def show(found: list[dict], since: float) -> str:
    """The events, one a line, their times relative to ``since``."""
    return "\n".join(json.dumps({**e, "t": round(e["t"] - since, 3)}) for e in found)


def find(found: list[dict], group: int, event: str) -> list[dict]:
    return [e for e in found if e["group"] == group and e["event"] == event]


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def lighthouses(pids: list[int]) -> list[int]:
    """Those of ``pids`` that run a lighthouse (:mod:`shoal.train.ft.lighthouse_main`)."""
    found = []
    for pid in pids:
        try:
            if b"lighthouse_main.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


SURVIVOR_COMMIT_S = 5.0
"""The survivor's next commit after a kill (about 1 s: the lighthouse's heartbeat timeout)."""


def check_group_one_healed(found: list[dict], victim: int, output: str, killed_at: float) -> None:
    """Group 1 (pid ``victim``) was SIGKILLed at ``killed_at`` and its launcher restarted it (it said so
    in ``output``): as :func:`check_group_one_returned`, the new process being its second start."""
    check_group_one_returned(found, victim, killed_at)
    assert [e["starts"] for e in find(found, 1, "start")] == [1, 2], found
    assert f"replica group 1 (pid {victim}) was killed by SIGKILL" in output, output[-5000:]


def check_group_one_returned(found: list[dict], victim: int, killed_at: float) -> None:
    """Group 1 (pid ``victim``) was SIGKILLed at ``killed_at`` and started again, by whatever runs it:
    group 0 kept its one process and committed again within :data:`SURVIVOR_COMMIT_S`; group 1's new
    process healed and committed; both finished the same step with the same weights."""
    assert len({e["pid"] for e in found if e["group"] == 0}) == 1 and len(find(found, 0, "start")) == 1, found
    after = [e for e in find(found, 0, "quorum") if e["t"] > killed_at]
    assert after and after[0]["t"] - killed_at < SURVIVOR_COMMIT_S, show(found, killed_at)
    starts = find(found, 1, "start")
    assert len(starts) == 2 and starts[1]["pid"] != victim, found
    assert [e for e in find(found, 1, "healed") if e["pid"] == starts[1]["pid"]], show(found, killed_at)
    assert any(e["pid"] == starts[1]["pid"] for e in find(found, 1, "joined")), show(found, killed_at)
    finished = {e["group"]: e for e in found if e["event"] == "finished"}
    assert finished[0]["step"] == finished[1]["step"] and finished[0]["params"] == finished[1]["params"], finished
