"""A restarted lighthouse whose first quorum leaves a group out: the others train on at once.

torchft's lighthouse counts quorum ids from 1 in each of its lives (torchft/src/lighthouse.rs,
``quorum_id: 0`` in ``Lighthouse::new``, 0.2.0), and torchft's Manager reconfigures its
connections only when the id changes (torchft/manager.py, ``_async_quorum``). Four groups meet in
quorum 1; group 3 is SIGSTOPped and the lighthouse SIGKILLed at once. shoal starts the lighthouse
again, and its first quorum, of groups 0-2, is quorum 1 again. Before shoal gave each set of groups
its own id (``shoal.distributed.fault_tolerance.ReplicaClient``) the three kept the connections of the
four, waited for group 3 in every all-reduce until the collective timeout (10 s), dropped the
step, met in quorum 1 again, and never trained while group 3 was stopped. Here they commit again
within the collective timeout of the step group 3 hung in, plus a quorum; group 3, continued,
rejoins and heals, and every group ends with the same weights.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from ft_events import events, find, lighthouses, show

import procs
from listening import descendants
from shoal.progress import progress_path, read_one, run_progress_dir

pytestmark = [pytest.mark.multiprocess]

WORKLOAD = str(Path(__file__).parent / "scripts" / "dies_in_step.py") + ":DiesInStep"
GROUPS = 4
BACK_S = 40.0
"""The three's next commits after the lighthouse's restart: gloo's collective timeout (10 s) for the
step group 3 hung in, the lighthouse's restart and a quorum, on a loaded machine (never, before)."""


def _steps(out: Path) -> dict[int, int]:
    records = {group: read_one(progress_path(run_progress_dir(out), group)) for group in range(GROUPS)}
    return {group: record.step for group, record in records.items() if record is not None}


def test_a_restarted_lighthouse_that_leaves_a_group_out_does_not_stall_the_others(tmp_path):
    out = tmp_path / "run"
    proc = procs.start(
        "train", WORKLOAD, "--fault-tolerance", "--nproc", str(GROUPS), "--epochs", "6", "--device", "cpu",
        "--out", str(out), env=procs.launcher_free_env(DIE_GROUP="none", SAMPLES="4000"),
    )  # fmt: skip
    try:
        procs.wait_for(
            lambda: all(find(events(out), g, "joined") for g in range(GROUPS)), timeout=180, what="every group",
            unless=lambda: proc.poll() is not None,
        )  # fmt: skip
        stopped = find(events(out), 3, "start")[0]["pid"]
        lighthouse = lighthouses(descendants(proc.pid))[0]
        os.kill(stopped, signal.SIGSTOP)
        os.kill(lighthouse, signal.SIGKILL)
        since, before = time.time(), _steps(out)
        try:
            procs.wait_for(
                lambda: all(_steps(out)[g] >= before[g] + 10 for g in range(3)), timeout=BACK_S,
                what="groups 0-2 training without group 3", unless=lambda: proc.poll() is not None,
                details=lambda: show(events(out), since),
            )  # fmt: skip
            back_s = time.time() - since
        finally:
            os.kill(stopped, signal.SIGCONT)
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        procs.kill_group(proc)
    found = events(out)
    assert proc.returncode == 0, stderr[-3000:] + stdout[-2000:]
    assert "starting it again (restart 1)" in stderr, stderr[-3000:]
    assert back_s < BACK_S, show(found, since)
    # The three met without group 3 in the restarted lighthouse's first quorum: its id 1 again.
    after = [e for e in found if e["t"] > since and e["event"] == "quorum"]
    assert any(e["group"] == 0 and e["participants"] == 3 and e["quorum"] == 1 for e in after), show(found, since)
    # Group 3 came back in the same process, received the others' state, and ended as they did.
    assert len(find(found, 3, "start")) == 1, show(found, since)
    finished = [e for e in found if e["event"] == "finished"]
    assert len(finished) == GROUPS and len({e["params"] for e in finished}) == 1, show(found, since)
