"""The cluster verdicts and the probe schedule, on measured-looking data: who is named, and when not."""

from __future__ import annotations

import itertools

import pytest

from shoal.doctor.model import Check, NodeReport
from shoal.doctor.probes import round_robin
from shoal.doctor.verdicts import allreduce_check, link_checks, storage_check, suspect_links, versions_check

GB = 1e9


@pytest.mark.parametrize("n", range(1, 10))
def test_the_schedule_pairs_every_two_nodes_once_in_rounds_of_disjoint_pairs(n):
    rounds = round_robin(n)
    pairs = [pair for pairs in rounds for pair in pairs]
    assert sorted(pairs) == list(itertools.combinations(range(n), 2))
    for pairs in rounds:
        nodes = [node for pair in pairs for node in pair]
        assert len(nodes) == len(set(nodes))
    assert len(rounds) <= max(1, n if n % 2 else n - 1)


def _links(n: int, rate, rtt=lambda a, b: 2e-4) -> list[dict]:
    return [
        {"a": a, "b": b, "hosts": [f"n{a}", f"n{b}"], "rtt_s": rtt(a, b), "a_to_b": rate(a, b), "b_to_a": rate(b, a)}
        for a, b in itertools.combinations(range(n), 2)
    ]


LABELS = {i: f"node {i} (n{i})" for i in range(8)}


def test_a_node_slow_on_every_link_is_named_as_the_node():
    links = _links(5, lambda a, b: 2.5e6 if 3 in (a, b) else 1 * GB)
    latency, bandwidth = link_checks(links, LABELS)
    assert latency.status == "ok"
    assert bandwidth.status == "fail" and bandwidth.data["slow_nodes"] == ["node 3 (n3)"]
    assert bandwidth.summary == (
        "node 3 (n3) is slow: 2.5 MB/s on all its 4 links (it sends and receives slowly; the links between the "
        "other nodes: 1,000.0 MB/s); at 2.5 MB/s a ResNet-18 gradient all-reduce (44.7 MB, 5 nodes) takes ~29 s "
        "per step at that rate"
    )
    assert {(lk["a"], lk["b"]) for lk in links if lk["status"] == "fail"} == {(0, 3), (1, 3), (2, 3), (3, 4)}
    assert len(suspect_links(links)) == 4


def test_one_slow_link_is_named_as_a_link_and_a_mild_one_is_a_warning():
    links = _links(4, lambda a, b: 0.2 * GB if {a, b} == {0, 2} else 1 * GB)
    _, bandwidth = link_checks(links, LABELS)
    assert bandwidth.status == "warn" and bandwidth.data["slow_nodes"] == []
    assert bandwidth.summary.startswith("the link node 0 (n0) - node 2 (n2) is slow: 200.0 MB/s")
    assert link_checks(_links(4, lambda a, b: 0.5 * GB if {a, b} == {0, 2} else 1 * GB), LABELS)[1].status == "ok"


def test_two_nodes_one_link_judged_on_the_absolute_scale_and_by_its_directions():
    """One link: no other to compare it with, but 1 MB/s costs every step 45 s of ResNet-18 gradients."""
    latency, bandwidth = link_checks(_links(2, lambda a, b: 1e6), LABELS)
    assert (latency.status, bandwidth.status) == ("ok", "fail")
    assert bandwidth.summary == (
        "1 link(s): median 1.0 MB/s, slowest 1.0 MB/s: every link is slow for data-parallel training: at 1.0 MB/s "
        "a ResNet-18 gradient all-reduce (44.7 MB, 2 nodes) takes ~45 s per step at that rate"
    )
    assert "--comm-hook" in bandwidth.hint
    assert link_checks(_links(2, lambda a, b: 1 * GB), LABELS)[1].status == "ok"
    # One direction limited (node 1's egress): the direction is named, and the scale makes it a fail.
    links = _links(2, lambda a, b: 2.4e6 if a == 1 else 1.7 * GB)
    _, bandwidth = link_checks(links, LABELS)
    assert bandwidth.status == "fail" and links[0]["status"] == "fail"
    assert bandwidth.summary.startswith("node 1 (n1) -> node 0 (n0) is slow: 2.4 MB/s, the other way 1,700.0 MB/s; ")
    # A milder asymmetry on a fast link: a warning naming the direction, nothing on the absolute scale.
    _, bandwidth = link_checks(_links(2, lambda a, b: 0.2 * GB if a == 1 else 1 * GB), LABELS)
    assert bandwidth.status == "warn" and bandwidth.summary == (
        "node 1 (n1) -> node 0 (n0) is slow: 200.0 MB/s, the other way 1,000.0 MB/s"
    )


def test_a_slow_node_among_three_is_named_though_the_median_link_is_its_own():
    """The issue's figures (3 namespace nodes, node 2's egress at 20 Mbit/s): the old median rule said ok."""
    rates = {(0, 1): 1700e6, (1, 0): 1650e6, (0, 2): 215.3e6, (2, 0): 2.4e6, (1, 2): 1693.7e6, (2, 1): 2.4e6}
    links = _links(3, lambda a, b: rates[a, b])
    _, bandwidth = link_checks(links, LABELS)
    assert bandwidth.status == "fail" and bandwidth.data["slow_nodes"] == ["node 2 (n2)"]
    assert bandwidth.summary.startswith(
        "node 2 (n2) is slow: 2.4 MB/s on all its 2 links (it sends slowly; the links between the other nodes: "
        "1,675.0 MB/s); at 2.4 MB/s a ResNet-18 gradient all-reduce (44.7 MB, 3 nodes) takes ~25 s per step"
    )
    assert [(lk["a"], lk["b"], lk["status"]) for lk in links] == [(0, 1, "ok"), (0, 2, "fail"), (1, 2, "fail")]
    assert {(lk["a"], lk["b"]) for lk in suspect_links(links)} == {(0, 2), (1, 2)}
    # The same node limited on what it receives only.
    links = _links(3, lambda a, b: 2.4e6 if b == 2 else 1.7 * GB)
    _, bandwidth = link_checks(links, LABELS)
    assert bandwidth.data["slow_nodes"] == ["node 2 (n2)"] and "(it receives slowly;" in bandwidth.summary


def test_equal_links_are_ok_and_equally_slow_ones_fail_on_the_absolute_scale():
    for n in (3, 4):
        assert link_checks(_links(n, lambda a, b: 1 * GB), LABELS)[1].status == "ok"
        _, bandwidth = link_checks(_links(n, lambda a, b: 20e6), LABELS)  # 160 Mbit/s everywhere
        assert bandwidth.status == "warn" and bandwidth.data["slow_nodes"] == []
        assert "every link is slow for data-parallel training" in bandwidth.summary


def test_the_allreduce_is_judged_on_the_same_scale():
    slow = allreduce_check({"seconds": 0.5, "bytes": 2**20}, 3, ["node 2 (n2)"])
    assert slow.status == "fail" and slow.summary == (
        "1.00 MiB across 3 ranks in 500.0 ms (slowest rank): bus bandwidth 2.8 MB/s (held back by node 2 (n2)): "
        "a ResNet-18 gradient all-reduce (44.7 MB, 3 ranks) takes ~21 s per step at that rate"
    )
    assert allreduce_check({"seconds": 0.002, "bytes": 2**20}, 3, []).status == "ok"
    assert allreduce_check({"seconds": 0.05, "bytes": 2**20}, 2, []).status == "warn"  # 21 MB/s: 2.1 s a step


def test_a_broken_link_fails_and_a_far_link_warns():
    links = _links(3, lambda a, b: 1 * GB, rtt=lambda a, b: 0.02 if {a, b} == {1, 2} else 2e-4)
    links[0] = {"a": 0, "b": 1, "hosts": ["n0", "n1"], "error": "node 1 (n1): no answer from node 0 (n0) within 10.0 s"}
    latency, bandwidth = link_checks(links, LABELS)
    assert bandwidth.status == "fail" and bandwidth.summary.startswith("1 link(s) failed: node 0 (n0) - node 1 (n1): ")
    assert latency.status == "ok"  # two measured links: their median is the slow one's own half
    latency, _ = link_checks(_links(4, lambda a, b: GB, rtt=lambda a, b: 0.02 if {a, b} == {1, 2} else 2e-4), LABELS)
    assert latency.status == "warn" and "slowest 20.00 ms (node 1 (n1) - node 2 (n2))" in latency.summary


def _node(rank: int, **versions: str) -> NodeReport:
    base = {"python": "3.11.7", "torch": "2.15.0", "cuda": "13.2", "nccl": "2.30.7", "shoal": "0.1.0"}
    return NodeReport(f"n{rank}", [Check("python", "ok", "x")], {**base, **versions}, node_rank=rank, ranks=[rank])


def test_versions_that_differ_name_the_odd_nodes_against_the_majority():
    nodes = [_node(0), _node(1, torch="2.14.1"), _node(2), _node(3, shoal="0.0.9", torch="2.14.1")]
    check = versions_check(nodes)
    assert check.status == "fail"
    assert check.summary == (
        "torch differs: node 1 (n1): 2.14.1, node 3 (n3): 2.14.1; 2.15.0 on the other 2 node(s); "
        "shoal differs: node 3 (n3): 0.0.9; 0.1.0 on the other 3 node(s)"
    )
    assert versions_check(nodes[:1] + nodes[2:3]).status == "ok"


def test_storage_names_the_nodes_that_cannot_read_the_token():
    check = storage_check("/shared/.t", None, {"node 2 (n2)": "/shared/.t does not exist on this node after 2 s"}, 4)
    assert check.status == "fail" and check.summary.startswith("1 of 4 node(s) do not see rank 0's token: node 2 (n2)")
    assert storage_check("/shared/.t", "Read-only file system", {}, 4).summary.startswith("rank 0 cannot write")
    assert storage_check("/shared/.t", None, {}, 4).status == "ok"
