"""``shoal train --fault-tolerance``: a replica group SIGKILLed mid-run costs the other one step.

One real run (2 replica groups of one process, a supervised torchft lighthouse, gloo over
loopback): group 1 is SIGKILLed right after its first commit; the survivor commits again within
seconds and is never restarted, the launcher restarts group 1, which heals from the survivor; then
the lighthouse is SIGKILLed and started again; both groups end with identical weights. Every
socket of the job listens on loopback. Then the same command with one more epoch resumes from the checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from ft_events import events as _events
from ft_events import find as _find
from ft_events import lighthouses
from ft_events import show as _show

import procs
from conftest import run_shoal
from listening import descendants, is_loopback, listening

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

EPOCHS = 4
BATCH = 4  # small batches, many steps (10 ms each here): room for a kill, a restart, a heal and a
# lighthouse restart before the end, on a quiet machine too
SURVIVOR_COMMIT_S = 5.0
"""The survivor's next commit after the kill (about 1-2 s here: lighthouse heartbeat 1 s)."""


def _train(out: Path, epochs: int) -> list[str]:
    return ["train", "digits", "--fault-tolerance", "--nproc", "2", "--epochs", str(epochs), "--device", "cpu",
            "--batch-size", str(BATCH), "--out", str(out)]  # fmt: skip


def _lighthouses(launcher: int) -> list[int]:
    """The PIDs of the launcher's lighthouse processes."""
    return lighthouses(descendants(launcher))


def test_a_killed_group_costs_one_step_and_heals(tmp_path):
    out = tmp_path / "run"
    proc = procs.start(*_train(out, EPOCHS), env=procs.launcher_free_env())
    try:
        procs.wait_for(lambda: _find(_events(out), 1, "joined"), timeout=180, what="group 1's first commit")
        # Everything the job listens on (lighthouse, stores, manager servers, gloo): loopback only.
        sockets = listening(descendants(proc.pid))
        victim = _find(_events(out), 1, "start")[0]["pid"]
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        procs.wait_for(lambda: len(_find(_events(out), 1, "joined")) == 2, timeout=120, what="group 1 back")
        # Then the lighthouse dies too: shoal starts it again, and the groups go on together.
        first = _lighthouses(proc.pid)
        lighthouse_killed_at = time.time()
        os.kill(first[0], signal.SIGKILL)
        procs.wait_for(lambda: set(_lighthouses(proc.pid)) - set(first), timeout=30, what="a new lighthouse")
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        procs.kill_group(proc)
    assert proc.returncode == 0, stderr[-3000:] + stdout[-2000:]
    events = _events(out)
    assert sockets and all(is_loopback(address) for address, _, _ in sockets), sockets
    assert "torchft's lighthouse on 127.0.0.1" in stderr and "starting it again (restart 1)" in stderr, stderr

    # The survivor: one process until the lighthouse was killed, its next commit within seconds of
    # the kill. (A fresh lighthouse may issue its first quorum before it has heard from every group,
    # which costs the groups a dropped step or a collective timeout: docs/BENCHMARKS.md, "A lighthouse restart".)
    before = [e for e in events if e["t"] < lighthouse_killed_at]
    survivor = {e["pid"] for e in before if e["group"] == 0}
    assert len(survivor) == 1 and len(_find(before, 0, "start")) == 1, _show(events, killed_at)
    # Its first commit in a new quorum (alone, or with group 1 back already), whether the kill hit
    # the all-reduce (a dropped step) or fell between two steps.
    after = [e for e in _find(events, 0, "quorum") if e["t"] > killed_at]
    assert after and after[0]["t"] - killed_at < SURVIVOR_COMMIT_S, _show(events, killed_at)

    # The victim: restarted by the launcher (a new pid), healed from the survivor, committed again.
    starts = _find(before, 1, "start")
    assert [e["starts"] for e in starts] == [1, 2] and starts[1]["pid"] != victim, _show(events, killed_at)
    # After the lighthouse's restart: at most one more restart of each group.
    assert len(_find(events, 0, "start")) <= 2 and len(_find(events, 1, "start")) <= 3, _show(events, killed_at)
    assert f"replica group 1 (pid {victim}) was killed by SIGKILL" in stderr
    healed = [e for e in _find(events, 1, "healed") if e["pid"] == starts[1]["pid"]]
    assert healed and healed[0]["step"] >= 1, _show(events, killed_at)
    assert any(e["pid"] == starts[1]["pid"] for e in _find(events, 1, "joined")), events

    # metrics.jsonl: every epoch has all its steps committed, each with its number of groups (the
    # kill shows as a dropped step or steps of one group, unless group 1 was back within the
    # lighthouse's heartbeat timeout); samples seen are those of the groups that committed.
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == list(range(1, EPOCHS + 1)), records
    steps = records[0]["steps_committed"]  # per epoch: the groups' shards in batches, the tail dropped
    assert all(r["steps_committed"] == steps == len(r["participants"]) for r in records), records
    assert all(r["samples_seen"] == BATCH * sum(r["participants"]) for r in records), records
    assert records[0]["participants"][0] == 2, records  # the first quorum holds both groups
    assert records[-1]["test_accuracy"] > 0.7, records

    # Both groups finished the same step with the same weights.
    finished = {e["group"]: e for e in events if e["event"] == "finished"}
    assert finished[0]["step"] == finished[1]["step"] == EPOCHS * steps, finished
    assert finished[0]["params"] == finished[1]["params"], finished

    # The dead group in one line each: the launcher's (node, step of its last commit), the group's
    # (healed at step N, X s after it started), and shoal status's row.
    died = [e for e in _find(events, 1, "died") if e["pid"] == victim]
    assert died and died[0]["node"] == 0 and died[0]["step"] >= 1, _show(events, killed_at)
    assert f"(pid {victim}) was killed by SIGKILL on node 0 (127.0.0.1) at step {died[0]['step']} (its last" in stderr
    assert f"replica group 1 on node 0 (127.0.0.1) healed at step {healed[0]['step']}, " in stdout, stdout[-3000:]
    shown = run_shoal("status", str(out), "--json")
    assert shown.returncode == 0, shown.stderr
    table = json.loads(shown.stdout)["replica_groups"]
    assert table["lighthouse"].startswith("http://127.0.0.1:"), table
    rows = {g["group"]: g for g in table["groups"]}
    assert {g["state"] for g in rows.values()} == {"finished"} and rows[1]["starts"] >= 2, rows
    assert rows[0]["step"] == rows[1]["step"] == EPOCHS * steps, rows
    assert rows[1]["died"]["step"] == died[-1]["step"] and "killed by SIGKILL at step" in rows[1]["failure"], rows

    # A whole-job restart with one more epoch resumes from the last checkpoint, not from step 0.
    again = run_shoal(*_train(out, EPOCHS + 1), timeout=240, env=procs.launcher_free_env())
    assert again.returncode == 0, again.stderr[-3000:]
    later = _events(out)[len(events) :]
    assert min(e["step"] for e in later if e["event"] == "joined") == EPOCHS * steps + 1, later
    assert {e["step"] for e in later if e["event"] == "finished"} == {(EPOCHS + 1) * steps}, later
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == list(range(1, EPOCHS + 2)), records
    assert records[-1]["steps_committed"] == steps and records[-1]["steps_dropped"] == 0, records


def test_a_launcher_killed_outright_leaves_no_group_nor_lighthouse(tmp_path):
    out = tmp_path / "run"
    proc = procs.start(*_train(out, 50), env=procs.launcher_free_env())
    try:
        procs.wait_for(lambda: _find(_events(out), 1, "joined"), timeout=180, what="group 1's first commit")
        started = [pid for pid in descendants(proc.pid) if pid != proc.pid]
        assert len(_lighthouses(proc.pid)) == 1 and len(started) >= 3, started  # the lighthouse, 2 groups
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
        procs.wait_for(lambda: not any(procs.alive(pid) for pid in started), timeout=30, what="no process left")
    finally:
        procs.kill_group(proc)
