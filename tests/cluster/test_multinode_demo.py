"""``shoal demo send-recv|all-reduce``: on one node under ``shoal run``, alone with ``--nproc``, and
across two namespaced nodes."""

from __future__ import annotations

import re

import pytest

from cluster.helpers import describe, shoal_on, wait_all

pytestmark = pytest.mark.multiprocess


def test_all_reduce_under_shoal_run(tmp_path):
    item = shoal_on(
        None, ["run", "--nproc", "2", "-m", "shoal", "demo", "all-reduce", "--size", "1000"], tmp_path / "log"
    )
    wait_all([item], 180)
    out = item.output
    assert item.returncode == 0, out
    for rank in (0, 1):
        assert re.search(
            rf"\[rank {rank}/2 on [^\]]*\] all_reduce\(sum\) of 1,000 floats = 3 "
            rf"\(expected 3\) in [\d.]+ ms: OK",
            out,
        ), out
    assert "shoal demo all-reduce: 2 ranks on 1 node: " in out and "bus bandwidth" in out
    assert "shoal demo all-reduce: all 2 ranks got the right sum" in out


def test_send_recv_with_its_own_workers(tmp_path):
    item = shoal_on(None, ["demo", "send-recv", "--nproc", "3"], tmp_path / "log")
    wait_all([item], 180)
    out = item.output
    assert item.returncode == 0, out
    assert re.search(r"\[rank 0/3 on [^\]]*\] sent ranks 1\.\.2 their tensors \(1,000 floats each\)", out), out
    for rank in (1, 2):
        assert re.search(
            rf"\[rank {rank}/3 on [^\]]*\] received \[{rank}000, {rank}001, {rank}002, {rank}003, "
            rf"\.\.\.\] \(1,000 floats\) from rank 0 in [\d.]+ ms: OK",
            out,
        ), out
    assert "shoal demo send-recv: all 2 other ranks received their tensor from rank 0 (3 ranks, 1 node)" in out


def test_one_process_has_nothing_to_exchange(tmp_path):
    item = shoal_on(None, ["demo", "send-recv"], tmp_path / "log")
    wait_all([item], 120)
    assert item.returncode == 0, item.output
    assert "nothing to exchange; try `shoal demo send-recv --nproc 2`" in item.output


@pytest.mark.slow
def test_send_recv_across_two_nodes(two_nodes, tmp_path):
    a, b = two_nodes
    launched = [
        shoal_on(
            node,
            [
                "demo",
                "send-recv",
                "--nproc",
                "2",
                "--nnodes",
                "2",
                "--node-rank",
                str(rank),
                "--master-addr",
                a.addr,
                "--join-timeout",
                "120",
            ],
            tmp_path / f"{node.name}.log",
        )
        for rank, node in enumerate((a, b))
    ]
    wait_all(launched, 240)
    assert [item.returncode for item in launched] == [0, 0], describe(launched)
    out_a, out_b = (item.output for item in launched)
    assert f"via {a.ifname} (node 0, local rank 0, cpu, gloo)] sent ranks 1..3" in out_a, out_a
    for rank in (2, 3):
        assert re.search(
            rf"\[rank {rank}/4 on \S+ via {b.ifname} \(node 1, local rank {rank - 2}, cpu, gloo\)\] "
            rf"received \[{rank}000, .*: OK",
            out_b,
        ), out_b
    assert "shoal demo send-recv: all 3 other ranks received their tensor from rank 0 (4 ranks, 2 nodes)" in out_a
    assert "waiting for the static rendezvous at 10.77.0.1:29500" in out_b  # torch's default port
