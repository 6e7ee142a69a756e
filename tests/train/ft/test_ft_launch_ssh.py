"""``shoal launch --hosts node0:1,node1:1 --via ssh|mpirun -- shoal train ... --fault-tolerance``
through a real sshd (the pods of tests/cluster_mpi/test_launch_real_ssh.py).

Each rank (started by each host's ``shoal run`` over SSH, or by Open MPI's mpirun through
``shoal.jobs.hosts.rank_status``) is a node of one replica group: it forks the group and restarts it
when it dies, so the outer launcher (the agent, or mpirun, which would stop every rank on a rank's
failure) never sees a failure. Rank 0 serves the
lighthouse on its pod's address. Group 1 (node1) is SIGKILLed after its first commit: group 0 trains
on with the same process, group 1 comes back and heals over the pods' link, and both end on the
same weights.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from ft_events import check_group_one_healed, events, find, lighthouses, metrics

import procs
from cluster_mpi.test_launch_real_ssh import _env, cluster  # noqa: F401 (the pods with sshd: a fixture)
from listening import listening

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

EPOCHS = 12
"""Enough steps after the kill for group 1's new process to come back before group 0 ends the job:
groups on different hosts meet no gate before their first quorum, so group 0 may train half the job
before group 1 first joins, and at EPOCHS = 4 a loaded machine (load 13) let group 0 finish the last
1.5 s of steps before the restarted group had started."""
BATCH = 4


@pytest.mark.parametrize("via", ["ssh", "mpirun"])
def test_a_group_killed_under_shoal_launch_heals_and_nobody_else_restarts(cluster, tmp_path, via):  # noqa: F811
    net, _ = cluster
    out = tmp_path / "run"
    train = ["shoal", "train", "digits", "--fault-tolerance", "--epochs", str(EPOCHS), "--batch-size", str(BATCH),
             "--device", "cpu", "--out", str(out)]  # fmt: skip
    log = tmp_path / "launch.log"
    with open(log, "w") as sink:
        proc = net["node0"].popen(
            [sys.executable, "-m", "shoal.cli.launch", "--hosts", "node0:1,node1:1", "--via", via, "--", *train],
            env=_env(), cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        procs.wait_for(
            lambda: all(find(events(out), g, "joined") for g in (0, 1)), timeout=240, what="both groups' first commit",
            unless=lambda: proc.poll() is not None, details=log.read_text,
        )  # fmt: skip
        groups = [find(events(out), g, "start")[0]["pid"] for g in (0, 1)]
        sockets = listening([*groups, *lighthouses(net["node0"].pids())])
        victim = groups[1]
        assert victim in net["node1"].pids(), (victim, net["node1"].pids())  # group 1 runs on node1
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    assert proc.returncode == 0, output[-5000:]
    found = events(out)
    addrs = {net["node0"].addr, net["node1"].addr}
    assert sockets and {address for address, _, _ in sockets} <= addrs, sockets
    assert f"lighthouse http://{net['node0'].addr}:" in output, output[-5000:]

    check_group_one_healed(found, victim, output, killed_at)
    assert [r["epoch"] for r in metrics(out)] == list(range(1, EPOCHS + 1))
