"""``shoal train --fault-tolerance --strategy fsdp --nproc 4 --nproc-per-group 2``: HSDP, FSDP2 inside
each of 2 replica groups of 2 processes, replicas across them.

One real run (gloo over loopback, a supervised lighthouse): rank 1 of group 1 is SIGKILLed after
the group's first commit. The launcher stops the rest of group 1 and starts the whole group again;
group 0 keeps its processes and commits again within seconds; each restarted rank receives its own
shards of the model and of AdamW's state from the same rank of group 0; both groups finish the same
step with the same whole-model weights. Then the same command with one more epoch resumes every
group from the writer group's sharded (DCP) checkpoint. The exactness of HSDP against one process
is tests/train/ft/test_own_loop.py's.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from ft_events import SURVIVOR_COMMIT_S, events, find, kill_group_one, metrics, show

import procs
from conftest import run_shoal, shoal_cmd
from listening import descendants

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

EPOCHS = 3


def _train(out: Path, epochs: int) -> list[str]:
    return ["train", "digits", "--fault-tolerance", "--strategy", "fsdp", "--nproc", "4", "--nproc-per-group", "2",
            "--optimizer", "adamw", "--lr", "0.002", "--epochs", str(epochs), "--batch-size", "4", "--device", "cpu",
            "--out", str(out)]  # fmt: skip


def _next_sibling(pid: int, among: list[int]) -> int:
    """The process forked right after ``pid`` by the same parent: the group's next rank."""
    parent = _ppid(pid)
    return min(p for p in among if p > pid and _ppid(p) == parent)


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_rank_killed_in_a_sharded_group_restarts_its_group_which_heals_its_shards(tmp_path):
    out = tmp_path / "run"
    # Started fresh, as a user starts it, not from the suite's warm server (tests/warm.py), whose
    # torch is loaded already: what the command prints is part of what is tested.
    proc = subprocess.Popen(shoal_cmd(*_train(out, EPOCHS)), env=procs.launcher_free_env(), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    # Group 1's rank 0 speaks for it (its events); its rank 1 is killed.
    victim, killed_at, stdout, stderr = kill_group_one(
        proc, out, lambda pid: _next_sibling(pid, descendants(proc.pid)), timeout=240
    )
    assert proc.returncode == 0, stderr[-3000:] + stdout[-2000:]
    found = events(out)
    assert "2 replica groups of 2 processes (FSDP inside)" in stdout + stderr, stdout[-2000:]
    assert f"replica group 1 (rank 1 of 2, pid {victim}) was killed by SIGKILL" in stderr, stderr[-3000:]
    # torch's C++ warnings stay quiet under FSDP too (its config check imports torch: the log level
    # is set before it).
    assert "setSequenceNumberForGroup" not in stderr, stderr[-3000:]
    # Group 0 never restarted, and committed again within seconds of the kill.
    assert len(find(found, 0, "start")) == 1 and len({e["pid"] for e in found if e["group"] == 0}) == 1, found
    after = [e for e in find(found, 0, "quorum") if e["t"] > killed_at]
    assert after and after[0]["t"] - killed_at < SURVIVOR_COMMIT_S, show(found, killed_at)
    # Group 1 came back as a whole, healed and committed.
    starts = find(found, 1, "start")
    assert [e["starts"] for e in starts] == [1, 2] and starts[1]["pid"] != starts[0]["pid"], found
    assert [e for e in find(found, 1, "healed") if e["pid"] == starts[1]["pid"]], show(found, killed_at)
    finished = {e["group"]: e for e in found if e["event"] == "finished"}
    assert finished[0]["step"] == finished[1]["step"] and finished[0]["params"] == finished[1]["params"], finished
    assert [r["epoch"] for r in metrics(out)] == list(range(1, EPOCHS + 1))
    assert sorted(p.suffix for p in (out / "checkpoints").glob("ckpt-*")) == [".dcp"] * EPOCHS

    # A whole-job restart: every group loads the sharded checkpoint of the last epoch and trains one more.
    done = run_shoal(*_train(out, EPOCHS + 1), env=procs.launcher_free_env(), timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    records = metrics(out)
    assert [r["epoch"] for r in records] == list(range(1, EPOCHS + 2)), records
    assert records[-1]["steps_committed"] == records[0]["steps_committed"], records  # a whole epoch, not a restart
    last = {e["group"]: e for e in events(out) if e["event"] == "finished"}
    assert last[0]["params"] == last[1]["params"] and last[0]["step"] == finished[0]["step"] * (EPOCHS + 1) // EPOCHS
