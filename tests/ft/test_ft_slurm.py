"""``srun -n 2 shoal train --fault-tolerance`` on the real one-node Slurm cluster of
tests/cluster_slurm: each task is a node of one replica group, which it forks and restarts; group 1
SIGKILLed after its first commit heals, the step never sees a failed task, task 0's group commits
again within seconds with the same process, and both groups end on the same weights."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from ft_events import check_group_one_healed, events, find, metrics

import procs

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

EPOCHS = 4


def test_a_group_killed_in_an_srun_step_heals_and_the_step_goes_on(slurm, tmp_path):
    out = tmp_path / "run"
    log = tmp_path / "srun.log"
    cmd = ["srun", "-n", "2", "shoal", "train", "digits", "--fault-tolerance", "--epochs", str(EPOCHS),
           "--batch-size", "4", "--device", "cpu", "--out", str(out)]  # fmt: skip
    with open(log, "w") as sink:
        proc = subprocess.Popen(cmd, env=slurm.env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        procs.wait_for(
            lambda: all(find(events(out), g, "joined") for g in (0, 1)), timeout=240, what="both groups' first commit",
            unless=lambda: proc.poll() is not None, details=lambda: log.read_text() + slurm.logs(),
        )  # fmt: skip
        victim = find(events(out), 1, "start")[0]["pid"]
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        proc.wait(timeout=300)
    finally:
        procs.kill_group(proc)
    output = log.read_text()
    assert proc.returncode == 0, output[-5000:]
    found = events(out)
    check_group_one_healed(found, victim, output, killed_at)
    assert [r["epoch"] for r in metrics(out)] == list(range(1, EPOCHS + 1))
