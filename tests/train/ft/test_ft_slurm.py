"""Fault tolerance on the real one-node Slurm cluster of tests/cluster_slurm (slurmctld, slurmd, munge).

- ``shoal launch slurm -- shoal train --fault-tolerance``: the rendered batch script runs each replica
  group as a job step of its own beside the lighthouse it serves on the batch host. Every process
  of group 1's step (its launcher and its group) is SIGKILLed after its first commit, as a lost node
  would end them: the script starts that step again, the new group heals from group 0, group 0 keeps
  its one process and commits again within seconds, the job ends 0 and both groups end on the same
  weights; the lighthouse listens on the batch host's own address only. A node lost outright cannot
  be shown on one node (docs/FAULT_TOLERANCE.md, "Under Slurm", says what this proves and what not).
- ``srun -n 2 shoal train --fault-tolerance``: each task of one step is a node of one replica group,
  which it forks and restarts; group 1 SIGKILLed after its first commit heals, the step never sees a
  failed task, task 0's group commits again within seconds with the same process, and both groups
  end on the same weights (the path of `_as_job_rank` under Slurm's own variables).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ft_events import check_group_one_healed, check_group_one_returned, events, find, metrics

import procs
from listening import listening

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

EPOCHS = 4
STEP_EPOCHS = 6  # of 600 steps: tests/train/ft/scripts/slow_group.py's 2,400 points, 2 a step in each of 2 groups
SLOW_WORKLOAD = Path(__file__).parent / "scripts" / "slow_group.py"
LAUNCH = [sys.executable, "-m", "shoal.cli.launch"]


def test_a_group_step_killed_outright_is_started_again_by_the_batch_script(slurm, tmp_path):
    out, script = tmp_path / "run", tmp_path / "ft.sbatch"
    # 3,600 steps of at least 10 ms each (group 0 sleeps in every forward, and every step waits for it):
    # the survivor trains on for 36 s at least, however fast the machine, longer than Slurm takes to
    # start a step again here (10-23 s). A run of plain digits (no floor) once ended first in CI.
    train = ["shoal", "train", f"{SLOW_WORKLOAD}:SlowGroup", "--fault-tolerance", "--epochs", str(STEP_EPOCHS)]
    train += ["--batch-size", "2", "--device", "cpu"]
    slow = ["--env", "SLOW_GROUP=0", "--env", "SLOW_S=0.01"]
    submitted = subprocess.run(
        [*LAUNCH, "slurm", "--nproc-per-node", "2", "--script", str(script), "--output", str(tmp_path / "job-%j.out"),
         *slow, "--", *train, "--out", str(out)],
        env=slurm.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    log = tmp_path / f"job-{job_id}.out"

    def output() -> str:
        return (log.read_text() if log.exists() else "") + slurm.logs()

    try:
        procs.wait_for(
            lambda: all(find(events(out), g, "joined") for g in (0, 1)), timeout=240, what="both groups' first commit",
            unless=lambda: slurm.job(job_id).get("JobState") not in ("PENDING", "CONFIGURING", "RUNNING"),
            details=output,
        )  # fmt: skip
        lighthouse = _lighthouse_sockets(job_id)
        victim = find(events(out), 1, "start")[0]["pid"]
        step_launcher = _parent(victim)  # the step's one task: `shoal train`, which forked the group
        killed_at = time.time()
        for pid in (step_launcher, victim):  # everything the step ran on its node, as a lost node ends it
            os.kill(pid, signal.SIGKILL)
        info = slurm.wait_job(job_id, timeout=300)
    finally:
        subprocess.run(["scancel", job_id], env=slurm.env, capture_output=True, timeout=30)  # a job still running
    text = output()
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), f"{info}\n{text[-5000:]}"
    assert "replica group 1's step exited with status 137; starting it again (1/10)" in text, text[-5000:]
    assert f"replica group 1 (pid {victim})" not in text  # nobody inside the step restarted it: the script did

    check_group_one_returned(events(out), victim, killed_at)
    # The script numbered the step's start: the new group knows it is a return, and where it died.
    again = find(events(out), 1, "start")[1]
    assert again["starts"] == 2 and find(events(out), 1, "healed")[-1]["died_at"] is not None, events(out)
    assert [r["epoch"] for r in metrics(out)] == list(range(1, STEP_EPOCHS + 1))
    # The lighthouse served on the batch host's own address, the one the groups were given.
    (address, port), served = lighthouse
    assert f"lighthouse http://{address}:{port}" in text and served == {address}, (lighthouse, text[:2000])


def test_a_group_step_stopped_on_bad_input_ends_the_job(slurm, tmp_path):
    """Status 2 (a ShoalError) is what every group would say: no step starts again, the job ends 2."""
    script = tmp_path / "bad.sbatch"
    submitted = subprocess.run(
        [*LAUNCH, "slurm", "--nproc-per-node", "2", "--script", str(script), "--output", str(tmp_path / "job-%j.out"),
         "--", "shoal", "train", "no-such-workload", "--fault-tolerance", "--out", str(tmp_path / "run")],
        env=slurm.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    info = slurm.wait_job(job_id, timeout=120)
    text = (tmp_path / f"job-{job_id}.out").read_text()
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "2:0"), f"{info}\n{text}"
    assert "shoal: error: unknown workload 'no-such-workload'" in text and "stopped with status 2" in text, text
    assert "starting it again" not in text, text


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _lighthouse_sockets(job_id: str) -> tuple[tuple[str, int], set[str]]:
    """((address, port) the batch script's lighthouse was bound to, the addresses it listens on)."""
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"lighthouse_main.py" in b" ".join(argv[:2]) and f"SLURM_JOB_ID={job_id}".encode() in environ:
            host, _, port = argv[argv.index(b"--bind") + 1].decode().rpartition(":")
            return (host, int(port)), {a for a, p, _ in listening([int(entry.name)]) if p == int(port)}
    raise AssertionError(f"no lighthouse of job {job_id} found")


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
