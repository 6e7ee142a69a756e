"""The replica launcher's watch (:mod:`shoal.launch.replica_watch`) over a real process writing a
group's progress record: stuck in one phase, it is reported once with its stack; SIGKILLed, its
``died`` line names the node and the step of its last commit, and ``shoal status`` shows the group
dead and restarting (not a failed job). No torchft needed: the record is what the watch reads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import warm
from procs import wait_for
from shoal.launch.replica_watch import GroupWatch
from shoal.progress import read_progress
from shoal.replica_log import append_event, read_events

STUCK_GROUP = """
import sys, time
from shoal.progress import ProgressWriter
progress = ProgressWriter(sys.argv[1], 1)
for step in range(8):
    progress.phase("data", step)
    progress.step_done(4, 0.01)
progress.phase("backward")
time.sleep(600)
"""


def test_a_stuck_group_is_reported_and_a_killed_one_named_with_its_step(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    group = subprocess.Popen([sys.executable, "-c", STUCK_GROUP, str(run_dir / "progress")])
    try:
        append_event(
            run_dir,
            1,
            "start",
            pid=group.pid,
            starts=1,
            node=0,
            address="127.0.0.1",
            lighthouse="http://127.0.0.1:29510",
        )
        wait_for(lambda: any(r.phase == "backward" for r in read_progress(run_dir / "progress")), timeout=60)
        watch = GroupWatch(run_dir, node=0, address="127.0.0.1", hang_timeout=1.0, interval_s=0.0)
        lines: list[str] = []
        deadline = time.monotonic() + 30
        while not lines and time.monotonic() < deadline:
            lines += watch.poll({1: group.pid})
            time.sleep(0.2)
        (line,) = lines
        assert f"replica group 1 (pid {group.pid}) on node 0 (127.0.0.1) made no progress for" in line, line
        assert "in backward at step 8" in line and "the other groups go on without it" in line, line
        (saved,) = run_dir.glob("hang-*/group-1.txt")
        assert "step 8 phase backward" in saved.read_text() and "<string>" in saved.read_text()
        assert watch.poll({1: group.pid}) == []  # once per stall
        hung = [e for e in read_events(run_dir) if e["event"] == "hung"]
        assert hung and hung[0]["step"] == 8 and hung[0]["phase"] == "backward", hung

        os.kill(group.pid, signal.SIGKILL)
        group.wait()
        said = watch.died(1, group.pid, "was killed by SIGKILL", 3.25)
        assert said == "on node 0 (127.0.0.1) at step 8 (its last commit), 3.2 s after it started", said
    finally:
        group.kill()
        group.wait()

    proc = warm.run([sys.executable, "-m", "shoal", "status", str(run_dir), "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr  # a group being restarted is not a failed job
    (row,) = json.loads(proc.stdout)["replica_groups"]["groups"]
    assert row["state"] == "dead, restarting" and row["node"] == "node 0 (127.0.0.1)", row
    assert row["failure"] == "killed by SIGKILL at step 8" and row["step"] == 8, row
    text = warm.run([sys.executable, "-m", "shoal", "status", str(run_dir)], capture_output=True, text=True).stdout
    assert "replica groups (lighthouse http://127.0.0.1:29510):" in text, text
