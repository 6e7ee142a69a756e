"""Four replica groups: a group that dies inside a step's all-reduce frees every other group at once.

gloo's ring all-reduce of 4 groups has a group that is no neighbour of the dead one (group 3, when
group 1 dies: its neighbours are 2 and 0). The dead group's neighbours learn of the death from
their closed connections; group 3 is left waiting for a live neighbour that has given the step up.
Before shoal closed a failed group's connections (``shoal.distributed.fault_tolerance.release_peers``)
group 3 waited out gloo's collective timeout (10 s), and the lighthouse waited for it, so every
group did. Here group 1 SIGKILLs itself as backward begins in its 20th step
(tests/train/ft/scripts/dies_in_step.py), deterministically in the step: every survivor drops that step
and commits again within the lighthouse's heartbeat (1 s here), well inside the timeout.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ft_events import events, find, show

import procs
from conftest import run_shoal
from shoal.progress import progress_path, read_one, run_progress_dir
from shoal.train.ft.loop import UNTIMED_STEPS

pytestmark = [pytest.mark.multiprocess]

WORKLOAD = str(Path(__file__).parent / "scripts" / "dies_in_step.py") + ":DiesInStep"
GROUPS, DIE_AT = 4, 20
FREED_S = 5.0
"""The survivors' next commit after the death: within the heartbeat timeout (1 s) and a restart's
heal, on a loaded machine; half of the collective timeout (10 s) that each waited without the fix."""


def test_a_group_dead_in_the_all_reduce_frees_the_groups_across_the_ring(tmp_path):
    out = tmp_path / "run"
    done = run_shoal(
        "train", WORKLOAD, "--fault-tolerance", "--nproc", str(GROUPS), "--device", "cpu", "--out", str(out),
        env=procs.launcher_free_env(DIE_GROUP="1", DIE_AT=str(DIE_AT)), timeout=240,
    )  # fmt: skip
    found = events(out)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    died = find(found, 1, "died")
    assert len(died) == 1 and "SIGKILL" in died[0]["how"], show(found, 0)
    since = died[0]["t"]
    for group in (0, 2, 3):
        # Each survivor was in the step the victim died in, and dropped it for a closed connection
        # (its own peer's death, or a live peer that closed its connections), not for a timeout.
        dropped = [e for e in find(found, group, "dropped") if e["step"] == DIE_AT]
        assert dropped, f"group {group} did not drop step {DIE_AT}\n" + show(found, since)
        assert dropped[0]["error"] == "another group's connection closed: it died, or gave the step up", dropped
        commits = [
            e["t"] for e in found if e["group"] == group and e["event"] in ("quorum", "recovered") and e["t"] > since
        ]
        assert commits and commits[0] - since < FREED_S, f"group {group}\n" + show(found, since)
    finished = [e for e in found if e["event"] == "finished"]
    assert len(finished) == GROUPS and len({e["params"] for e in finished}) == 1, finished
    # A process's first steps are counted, not timed: no straggler verdict on a restart's warm-up.
    record = read_one(progress_path(run_progress_dir(out), 0))
    assert (record.step, record.steps_timed) == (finished[0]["step"], finished[0]["step"] - UNTIMED_STEPS), record
    # The survivors' lines say the cause in a few words; the run ends as every run does.
    lines = done.stdout.splitlines()
    assert (
        f"shoal: replica group 0 dropped step {DIE_AT} (another group's connection closed: it died, or gave the step up); the live groups go on"
        in lines
    ), done.stdout[-3000:]
    assert lines[-1] == f"saved {out / 'model.pt'} and metrics in {out}", done.stdout[-3000:]
