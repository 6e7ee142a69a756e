"""Multi-node rendezvous that cannot work fail within --join-timeout, saying why.

All cases of one test run at once (they mostly wait), each in its own namespace port space.
"""

from __future__ import annotations

import pytest

from cluster.helpers import STEPS, describe, shoal_on, wait_all

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

JOIN = 6
"""The join timeout every case waits out, all at once: what is checked is that each gives up within it and
says why, not its length. A warm start reaches the rendezvous well within a second, so each case still
waits seconds there (it was 15: 15 s of wall for 1 CPU-s)."""
SLACK = 5  # shutting down; a busy machine


def test_wrong_address_closed_port_and_a_missing_node(two_nodes, tmp_path):
    a, b = two_nodes
    common = ["run", "--nproc", "2", "--nnodes", "2", "--join-timeout", str(JOIN)]
    static = [*common, "--master-port", "29555"]
    cases = {
        # node 0 is fine, but its partner was given a wrong master address: neither can start
        "host": (a, [*static, "--node-rank", "0", "--master-addr", a.addr]),
        "wrong": (b, [*static, "--node-rank", "1", "--master-addr", "10.77.0.9"]),
        # nothing listens where the node looks for the store
        "closed": (
            b,
            [
                "run",
                "--nproc",
                "2",
                "--nnodes",
                "2",
                "--join-timeout",
                str(JOIN),
                "--node-rank",
                "1",
                "--master-addr",
                a.addr,
                "--master-port",
                "29666",
            ],
        ),
        "c10d-closed": (b, [*common, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{a.addr}:29777"]),
        # a c10d host whose partner never comes
        "c10d-alone": (a, [*common, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{a.addr}:29888"]),
    }
    launched = {
        name: shoal_on(node, [*args, STEPS, str(tmp_path)], tmp_path / f"{name}.log")
        for name, (node, args) in cases.items()
    }
    wait_all(list(launched.values()), JOIN + 120, mark="waiting for the")
    report = describe(list(launched.values()))
    for name, item in launched.items():
        assert item.returncode == 1, f"{name}\n{report}"
        # The join timeout counts from the process start (importing torch included); on an idle
        # machine that is the whole story, on a busy one the imports alone can take longer.
        assert item.marked is not None and item.ended - item.marked < JOIN + SLACK, f"{name}\n{report}"
        last = item.output.strip().splitlines()[-2:]
        assert last[0].startswith("shoal: error: ") and last[1].startswith("HINT: "), f"{name}\n{report}"

    def error(name):
        return "\n".join(launched[name].output.strip().splitlines()[-2:])

    assert f"only 1 of 2 nodes arrived at the static rendezvous at {a.addr}:29555 within {JOIN} s" in error("host")
    assert (
        f"could not join the static rendezvous at 10.77.0.9:29555 within {JOIN} s: 10.77.0.9 does "
        f"not answer (from {b.addr} on {b.ifname})" in error("wrong")
    )
    assert (
        f"could not join the static rendezvous at {a.addr}:29666 within {JOIN} s: nothing listens on "
        f"port 29666 of {a.addr}" in error("closed")
    )
    assert "HINT: start node rank 0" in error("closed")
    assert (
        f"could not join the c10d rendezvous at {a.addr}:29777 within {JOIN} s: nothing listens on "
        f"port 29777 of {a.addr}" in error("c10d-closed")
    )
    assert f"only 1 of 2 nodes arrived at the c10d rendezvous at {a.addr}:29888 within {JOIN} s" in error("c10d-alone")


def test_an_unroutable_master_fails_before_anything_starts(two_nodes, tmp_path):
    _, b = two_nodes
    item = shoal_on(
        b,
        [
            "run",
            "--nproc",
            "2",
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--master-addr",
            "10.77.5.1",
            STEPS,
            str(tmp_path),
        ],
        tmp_path / "log",
    )
    wait_all([item], 60)
    assert item.returncode == 2
    assert item.output.strip().splitlines()[-2:] == [
        "shoal: error: no route from this node to the master 10.77.5.1 (10.77.5.1): Network is unreachable",
        "HINT: check --master-addr / --rdzv-endpoint: it must be the master node's address on a network "
        "this node is connected to (`ip route get 10.77.5.1` shows the route)",
    ]
