"""``shoal run`` across two nodes (two network namespaces), real gloo: 2 workers each for the plain
run, 1 each where a worker fails (what is asserted there is between nodes; each worker is an
interpreter that imports torch, about 2 CPU-s on this machine).

In each namespace the machine's hostname resolves to 127.0.0.1 and the only way to the other node
is a veth interface: plain torchrun fails there (see ../shared/ENVIRONMENT.md) unless told the
interface, address and store host, which shoal finds by itself.
"""

from __future__ import annotations

import re

import pytest

from cluster.helpers import STEPS, describe, results, shoal_on, wait_all
from shoal.errors import EXIT_ANOTHER_NODE_FAILED

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

TIMEOUT = 240  # both nodes, on a busy 2-core machine


def _static(node, rank, master, *extra, nproc=2):
    return [
        "run",
        "--nproc",
        str(nproc),
        "--nnodes",
        "2",
        "--node-rank",
        str(rank),
        "--master-addr",
        master,
        "--master-port",
        "29555",
        *extra,
    ]


def _c10d(nnodes, endpoint, *extra, nproc=2):
    return [
        "run",
        "--nproc",
        str(nproc),
        "--nnodes",
        nnodes,
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        *extra,
    ]


def _check_network_lines(a, b, launched, backend):
    out_a, out_b = (item.output for item in launched)
    assert f"shoal run: network: advertising {a.addr} on {a.ifname}" in out_a, out_a
    assert f"GLOO_SOCKET_IFNAME={a.ifname}, NCCL_SOCKET_IFNAME={a.ifname}" in out_a
    assert (
        f"shoal run: network: advertising {b.addr} on {b.ifname} (the interface that routes to the "
        f"master {a.addr})" in out_b
    ), out_b
    if backend == "c10d":
        assert "this node hosts the c10d store" in out_a
        assert f"the c10d store is hosted by {a.addr}" in out_b


def test_static_rendezvous_of_a_plain_script(two_nodes, tmp_path):
    a, b = two_nodes
    out = tmp_path / "out"
    out.mkdir()
    launched = [
        shoal_on(node, _static(node, rank, a.addr, STEPS, str(out)), tmp_path / f"{node.name}.log")
        for rank, node in enumerate((a, b))
    ]
    wait_all(launched, TIMEOUT)
    assert [item.returncode for item in launched] == [0, 0], describe(launched)
    found = results(out, 4)
    assert {r["world_size"] for r in found} == {4}
    assert {r["sum"] for r in found} == {40.0}  # 4 steps of 1+2+3+4
    assert [r["group_rank"] for r in found] == [0, 0, 1, 1]  # static: node rank = group rank
    assert {r["master_addr"] for r in found} == {a.addr}
    assert [r["ifname"] for r in found] == [a.ifname, a.ifname, b.ifname, b.ifname]
    _check_network_lines(a, b, launched, "static")
    assert "node 1 of 2), waiting for the static rendezvous at 10.77.0.1:29555" in launched[1].output


def _restart_check(a, b, launched, out):
    assert [item.returncode for item in launched] == [0, 0], describe(launched)
    found = results(out, 2)
    assert {r["world_size"] for r in found} == {2}
    assert {r["sum"] for r in found} == {15.0}  # all 5 steps of 1+2, by both ranks of the new group
    assert "shoal run: restarting the workers (restart 1 of 1)" in launched[1].output, describe(launched)
    # Node a restarted too: for its own failed workers, or (c10d) for the changed group, which
    # torch does not count as one of node a's restarts.
    assert re.search(
        r"shoal run: (restarting the workers \(restart 1 of 1\)|the other nodes changed)", launched[0].output
    ), describe(launched)
    return found


def test_elastic_c10d_a_killed_worker_restarts_the_group_and_the_job_completes(two_nodes, tmp_path):
    # Rank 1, the worker of the node with group rank 1, SIGKILLs itself in the first attempt; elastic.
    a, b = two_nodes
    out = tmp_path / "out"
    out.mkdir()
    args = _c10d(
        "1:2", f"{a.addr}:29400", "--max-restarts", "1", STEPS, str(out), "--die-rank", "1", "--steps", "5", nproc=1
    )
    launched = [shoal_on(node, args, tmp_path / f"{node.name}.log") for node in (a, b)]
    wait_all(launched, TIMEOUT)
    found = _restart_check(a, b, launched, out)
    # The workers' store is on whichever node got rank 0, at its routable address, never loopback.
    assert {r["master_addr"] for r in found} in ({a.addr}, {b.addr})
    assert {(r["ifname"], r["rank"]) for r in found} in (
        {(a.ifname, 0), (b.ifname, 1)},
        {(b.ifname, 0), (a.ifname, 1)},
    )
    assert [r["attempt"] for r in found if r["ifname"] == b.ifname] == [1]  # node b restarted once
    _check_network_lines(a, b, launched, "c10d")


def test_static_a_killed_worker_restarts_the_group_and_the_job_completes(two_nodes, tmp_path):
    a, b = two_nodes
    out = tmp_path / "out"
    out.mkdir()
    launched = [
        shoal_on(
            node,
            _static(
                node, rank, a.addr, "--max-restarts", "1", STEPS, str(out), "--die-rank", "1", "--steps", "5", nproc=1
            ),
            tmp_path / f"{node.name}.log",
        )
        for rank, node in enumerate((a, b))
    ]
    wait_all(launched, TIMEOUT)
    found = _restart_check(a, b, launched, out)
    assert [r["attempt"] for r in found] == [1, 1]  # both nodes' workers failed: both restarted
    assert {r["master_addr"] for r in found} == {a.addr}


def test_when_a_node_gives_up_the_other_stops_at_once(two_nodes, tmp_path):
    # Rank 1 (node b's) raises while rank 0 is in a two-minute "computation", in no collective that
    # could notice: node b reports rank 1's traceback, node a stops within seconds.
    a, b = two_nodes
    out = tmp_path / "out"
    out.mkdir()
    launched = [
        shoal_on(
            node,
            _static(node, rank, a.addr, STEPS, str(out), "--raise-rank", "1", nproc=1),
            tmp_path / f"{node.name}.log",
        )
        for rank, node in enumerate((a, b))
    ]
    wait_all(launched, 100)
    # node b has the failing rank; node a only saw another node end the job
    assert [item.returncode for item in launched] == [EXIT_ANOTHER_NODE_FAILED, 1], describe(launched)
    assert max(item.elapsed for item in launched) < 90  # not the two minutes of the others
    out_a, out_b = launched[0].output, launched[1].output
    assert "shoal: error: rank 1 failed: ValueError: boom at rank 1" in out_b
    assert "ValueError: boom at rank 1" in out_b.split("its traceback:", 1)[1]
    assert "shoal: error: another node ended the job (the rendezvous at 10.77.0.1:29555 was closed)" in out_a
    assert "HINT: " in out_a
