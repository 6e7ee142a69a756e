"""The replica launcher's watch (:mod:`shoal.train.ft.watch`) over real progress records: a
process stuck in one phase is reported once with its stack; SIGKILLed, its ``died`` line names the
node and the step of its last commit, and ``shoal status`` shows the group dead and restarting (not
a failed job). Three groups' records, one computing 3x longer: named a straggler once per episode,
by node 0's watch only, shown by ``shoal status``. No torchft needed: the records are what the
watch reads. Then one real fault-tolerant run whose group 1 is slow."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ft_events import events, find

import warm
from conftest import run_shoal
from procs import launcher_free_env, wait_for
from shoal.progress import ProgressWriter, read_progress
from shoal.train.ft.events import append_event, group_states, read_events
from shoal.train.ft.watch import GroupWatch

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


def _status(run_dir) -> dict:
    proc = warm.run([sys.executable, "-m", "shoal", "status", str(run_dir), "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return {g["group"]: g for g in json.loads(proc.stdout)["replica_groups"]["groups"]}


def test_a_group_computing_longer_than_the_others_is_a_straggler_once_per_episode(tmp_path):
    """Groups 0 and 1 on node 0, group 2 on node 1: their records in the shared run directory,
    written by real writers; 20 steps a window (10 s), 10 ms of compute a step, group 2 30 ms."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for group, node, address in ((0, 0, "127.0.0.1"), (1, 0, "127.0.0.1"), (2, 1, "10.0.0.2")):
        append_event(run_dir, group, "start", starts=1, node=node, address=address)
    writers = {g: ProgressWriter(run_dir / "progress", g, stacks=False) for g in range(3)}
    live = {0: os.getpid(), 1: os.getpid()}  # node 0's own groups
    watch = GroupWatch(run_dir, node=0, address="127.0.0.1", interval_s=0.0, window_s=10.0)
    other = GroupWatch(run_dir, node=1, address="10.0.0.2", interval_s=0.0, window_s=10.0)
    clock = [0.0]

    def window(slow: float) -> list[str]:
        for group, writer in writers.items():
            for _ in range(20):
                writer.step_done(8, slow if group == 2 else 0.010)
        clock[0] += 10.0
        assert other.poll({2: os.getpid()}, now=clock[0]) == []  # node 1's watch leaves it to node 0
        return watch.poll(live, now=clock[0])

    def said(event: str) -> list[dict]:
        return [e for e in read_events(run_dir) if e["event"] == event]

    try:
        assert watch.poll(live, now=0.0) == [] and other.poll({2: os.getpid()}, now=0.0) == []
        assert window(0.030) == [] and window(0.010) == []  # a blip
        assert window(0.030) == [] and window(0.030) == []  # two windows over the margin: not yet
        (line,) = window(0.030)
        assert line == (
            "shoal: replica group 2 on node 1 (10.0.0.2) is a straggler: 3.0x the other groups' compute per "
            "step (30.0 ms vs 10.0 ms, their median) over its last 20 steps; every group's step waits for it"
        ), line
        assert window(0.030) == [] and window(0.010) == []  # once per episode; one quick window is a blip
        (event,) = said("straggler")
        assert (event["group"], event["ratio"], event["steps"], event["node"]) == (2, 3.0, 20, 1), event
        groups = _status(run_dir)
        assert groups[2]["state"] == "straggler (3.0x compute)" and groups[2]["straggler"]["ratio"] == 3.0
        assert groups[0]["state"].startswith("training (") and groups[0]["straggler"] is None, groups

        assert window(0.010) == []
        (line,) = window(0.010)  # the third window in a row at the others' pace: the episode ends
        assert line == "shoal: replica group 2 on node 1 (10.0.0.2) keeps pace with the others again", line
        assert len(said("caught_up")) == 1 and group_states(read_events(run_dir))[2].straggler is None
        for _ in range(3):
            lines = window(0.030)
        assert len(lines) == 1 and len(said("straggler")) == 2  # a new episode, said again
    finally:
        for writer in writers.values():
            writer.close()


SLOW_GROUP = Path(__file__).parent / "scripts" / "slow_group.py"


@pytest.mark.multiprocess
def test_a_really_slow_group_is_named_in_a_real_run(tmp_path):
    """2 groups of `shoal train --fault-tolerance`, group 1 sleeping 20 ms in every forward."""
    out = tmp_path / "run"
    env = launcher_free_env(SLOW_GROUP="1", SHOAL_STRAGGLER_WINDOW_S="1")
    cmd = ["train", f"{SLOW_GROUP}:SlowGroup", "--fault-tolerance", "--nproc", "2", "--device", "cpu"]
    proc = run_shoal(*cmd, "--out", str(out), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = events(out)
    assert find(found, 1, "straggler") and not find(found, 0, "straggler"), found
    assert "shoal: replica group 1 on node 0 (127.0.0.1) is a straggler: " in proc.stderr, proc.stderr[-3000:]
