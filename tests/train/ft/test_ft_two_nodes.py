"""``shoal train --fault-tolerance`` on two nodes (network namespaces), one replica group each.

Node 0 serves the lighthouse on its own address; node 1 reaches it at the master's. Group 1 (node
1) is SIGKILLed after its first commit: group 0 commits again within seconds and is never restarted,
node 1's launcher restarts group 1, which heals from group 0 across the link; both end with identical
weights. Every socket of the job listens on a node's address, none on 0.0.0.0, [::] or loopback.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from ft_events import check_group_one_healed, events, find, metrics

import procs
from cluster.helpers import describe, shoal_on, wait_all
from cluster.netns import netns_unavailable, node_pair
from listening import listening

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

EPOCHS = 4
BATCH = 4  # many short steps: room for a kill, a restart and a heal before the end


def test_a_killed_node_group_costs_one_step_and_heals(tmp_path):
    skip = netns_unavailable()
    if skip:
        pytest.skip(f"two namespaced nodes cannot be made here: {skip}")
    out = tmp_path / "run"  # one directory both nodes see, as on a shared filesystem
    with node_pair() as (a, b):
        launched = [
            shoal_on(node, _train(out, rank, a.addr), tmp_path / f"{node.name}.log", cwd=tmp_path)
            for rank, node in enumerate((a, b))
        ]
        procs.wait_for(
            lambda: all(find(events(out), g, "joined") for g in (0, 1)), timeout=240, what="both groups' first commit",
            unless=lambda: any(item.proc.poll() is not None for item in launched), details=lambda: describe(launched),
        )  # fmt: skip
        sockets = listening(a.pids() + b.pids())
        victim = find(events(out), 1, "start")[0]["pid"]
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        wait_all(launched, 300)
    assert [item.returncode for item in launched] == [0, 0], describe(launched)
    found = events(out)
    # Every socket on a node's own address: the lighthouse, stores, manager servers, gloo.
    assert sockets and {address for address, _, _ in sockets} <= {a.addr, b.addr}, sockets
    assert f"serving the lighthouse on {a.addr}:29500" in launched[0].output, describe(launched)
    assert f"lighthouse http://{a.addr}:29500" in launched[1].output, describe(launched)

    # Node 0's group trains on with its process; node 1's launcher restarts its group, which heals.
    check_group_one_healed(found, victim, launched[1].output, killed_at)

    records = metrics(out)
    assert [r["epoch"] for r in records] == list(range(1, EPOCHS + 1)), records
    assert records[-1]["test_accuracy"] > 0.7, records


def _train(out, rank: int, master: str) -> list[str]:
    return ["train", "digits", "--fault-tolerance", "--nnodes", "2", "--node-rank", str(rank), "--master-addr", master,
            "--nproc", "1", "--epochs", str(EPOCHS), "--device", "cpu", "--batch-size", str(BATCH), "--out", str(out)]  # fmt: skip
