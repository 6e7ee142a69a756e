"""Cluster-wide verdicts from what the ranks sent rank 0: missing ranks, versions that differ, slow
links or nodes, the all-reduce, shared storage. Pure functions of plain data (tested without a job).

A link is *slow* when its bandwidth (the slower direction) is below :data:`SLOW_FRACTION` of the
median link's: a fail below :data:`FAIL_FRACTION`. A node all of whose links (two or more) are slow
is named as the slow node (its NIC, its cable, its switch port, its CPU); other slow links are named
as links. With two nodes there is one link and nothing to compare it with: it is reported, not judged.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from shoal.doctor.model import Check, NodeReport, fail, ok, warn

SLOW_FRACTION = 0.25
FAIL_FRACTION = 0.1
LATENCY_FACTOR = 5.0
LATENCY_MARGIN_S = 2e-3
VERSION_KEYS = ("python", "torch", "cuda", "nccl", "shoal")


def mb(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e6:,.1f} MB/s" if bytes_per_s < 1e10 else f"{bytes_per_s / 1e9:,.1f} GB/s"


def arrivals_check(world: int, missing: dict[str, list[int]], timeout: float) -> Check:
    """Ranks whose report (of a phase) never reached rank 0."""
    gaps = {phase: ranks for phase, ranks in missing.items() if ranks}
    if not gaps:
        return ok("arrivals", f"all {world} ranks reported in every phase", world_size=world)
    said = "; ".join(f"{phase}: rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}" for phase, r in gaps.items())
    return fail(
        "arrivals",
        f"no report within {timeout:g} s from {said}",
        "those ranks are stuck or gone: look at their nodes' output (a node that cannot reach the others "
        "stops in the link probes; raise --probe-timeout for very slow links)",
        missing=gaps,
    )


def versions_check(nodes: list[NodeReport]) -> Check:
    """Software that must be the same everywhere; the nodes that differ from the majority are named."""
    differing = []
    for key in VERSION_KEYS:
        values = Counter(node.versions.get(key, "?") for node in nodes)
        if len(values) < 2:
            continue
        usual = max(values, key=lambda v: (values[v], v == nodes[0].versions.get(key)))
        odd = [node for node in nodes if node.versions.get(key, "?") != usual]
        who = ", ".join(f"{node.label()}: {node.versions.get(key, '?')}" for node in odd)
        differing.append(f"{key} differs: {who}; {usual} on the other {len(nodes) - len(odd)} node(s)")
    if differing:
        return fail(
            "versions",
            "; ".join(differing),
            "install the same versions on every node (one container image, or one virtual environment on shared "
            "storage): mixed torch, NCCL or shoal versions break collectives, pickled objects and checkpoints",
            versions={node.label(): node.versions for node in nodes},
        )
    same = ", ".join(f"{k} {nodes[0].versions.get(k)}" for k in VERSION_KEYS) if nodes else ""
    return ok("versions", f"the same on all {len(nodes)} node(s): {same}")


def suspect_links(links: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The measured links below :data:`SLOW_FRACTION` of the median, slowest first."""
    rates = {id(lk): min(lk["a_to_b"], lk["b_to_a"]) for lk in links if not lk.get("error")}
    if len(rates) < 2:
        return []
    median = statistics.median(rates.values())
    slow = [lk for lk in links if id(lk) in rates and rates[id(lk)] < SLOW_FRACTION * median]
    return sorted(slow, key=lambda lk: rates[id(lk)])


def link_checks(links: list[dict[str, Any]], labels: dict[int, str]) -> list[Check]:
    """``latency`` and ``bandwidth`` from the measured links; marks each link's ``status`` in place.

    Each link: ``{"a", "b"}`` (node ranks), ``rtt_s``, ``a_to_b`` / ``b_to_a`` (bytes/s) or ``error``.
    """
    if not links:
        return [ok("bandwidth", "one node: no link between nodes to measure")]
    broken = [lk for lk in links if lk.get("error")]
    measured = [lk for lk in links if not lk.get("error")]
    for link in measured:
        link["bytes_per_s"] = min(link["a_to_b"], link["b_to_a"])
        link["status"] = "ok"
    for link in broken:
        link["status"] = "fail"
    checks = [_latency_check(measured, labels)]
    if not measured:
        checks.append(_broken_check(broken, labels, []))
        return checks
    median = statistics.median(lk["bytes_per_s"] for lk in measured)
    summary = f"{len(measured)} link(s): median {mb(median)}, slowest {mb(min(lk['bytes_per_s'] for lk in measured))}"
    slow = [lk for lk in measured if len(measured) > 1 and lk["bytes_per_s"] < SLOW_FRACTION * median]
    for link in slow:
        link["status"] = "fail" if link["bytes_per_s"] < FAIL_FRACTION * median else "warn"
    slow_nodes = _slow_nodes(links, slow)
    named = [f"{labels[n]} is slow: {_node_rate(n, slow)} on all its {_degree(n, links)} links" for n in slow_nodes]
    named += [
        f"the link {_pair(lk, labels)} is slow: {mb(lk['bytes_per_s'])}"
        for lk in slow
        if lk["a"] not in slow_nodes and lk["b"] not in slow_nodes
    ]
    if broken:
        checks.append(_broken_check(broken, labels, named))
    elif named:
        status = fail if any(lk["status"] == "fail" for lk in slow) else warn
        checks.append(
            status(
                "bandwidth",
                "; ".join(named) + f" (the links' median: {mb(median)})",
                "look at that node's network: its link speed (`ethtool`), traffic shaping (`tc qdisc show`), "
                "errors (`ip -s link`), the switch port, or a CPU too busy to feed it; every step of the job "
                "waits for the slowest link",
                slow_nodes=[labels[n] for n in slow_nodes],
                median_bytes_per_s=median,
            )
        )
    else:
        checks.append(ok("bandwidth", summary + ("" if len(measured) > 1 else " (one link: nothing to compare)")))
    return checks


def _latency_check(measured: list[dict[str, Any]], labels: dict[int, str]) -> Check:
    if not measured:
        return fail("latency", "no link could be measured", "see the bandwidth check")
    median = statistics.median(lk["rtt_s"] for lk in measured)
    worst = max(measured, key=lambda lk: lk["rtt_s"])
    summary = f"round trip median {median * 1e3:.2f} ms, slowest {worst['rtt_s'] * 1e3:.2f} ms ({_pair(worst, labels)})"
    if len(measured) > 1 and worst["rtt_s"] > max(LATENCY_FACTOR * median, median + LATENCY_MARGIN_S):
        return warn(
            "latency",
            summary,
            "a link far slower to answer than the others: a congested or distant path, or a node too busy "
            "to answer; small all-reduces (every DDP bucket) wait for it",
        )
    return ok("latency", summary, median_s=median)


def _broken_check(broken: list[dict[str, Any]], labels: dict[int, str], named: list[str]) -> Check:
    said = "; ".join(f"{_pair(lk, labels)}: {lk['error']}" for lk in broken[:4])
    more = f" (and {len(broken) - 4} more)" if len(broken) > 4 else ""
    return fail(
        "bandwidth",
        f"{len(broken)} link(s) failed: {said}{more}" + (f"; {'; '.join(named)}" if named else ""),
        "the nodes reached the rendezvous but not each other on the ports gloo/NCCL use: check firewalls "
        "between them (ports above 1024), GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, and that the node is alive",
    )


def _slow_nodes(links: list[dict[str, Any]], slow: list[dict[str, Any]]) -> list[int]:
    nodes = sorted({lk["a"] for lk in links} | {lk["b"] for lk in links})
    return [n for n in nodes if _degree(n, links) >= 2 and _degree(n, slow) == _degree(n, links)]


def _degree(node: int, links: list[dict[str, Any]]) -> int:
    return sum(node in (lk["a"], lk["b"]) for lk in links)


def _node_rate(node: int, slow: list[dict[str, Any]]) -> str:
    rates = [lk["bytes_per_s"] for lk in slow if node in (lk["a"], lk["b"])]
    return mb(statistics.median(rates))


def _pair(link: dict[str, Any], labels: dict[int, str]) -> str:
    return f"{labels[link['a']]} - {labels[link['b']]}"


def allreduce_check(result: dict[str, Any], world: int, slow_nodes: list[str]) -> Check:
    """The all-reduce across every rank: right sums, and its bus bandwidth (what every link carried)."""
    if result.get("error"):
        return fail(
            "allreduce",
            f"the all-reduce across {world} ranks failed: {result['error']}",
            "a collective across all ranks did not complete: see the bandwidth check for the link that broke",
        )
    seconds, nbytes = result["seconds"], result["bytes"]
    busbw = 2 * (world - 1) / world * nbytes / seconds if seconds else 0.0
    result["bus_bytes_per_s"] = busbw
    held = f" (held back by {', '.join(slow_nodes)})" if slow_nodes else ""
    return ok(
        "allreduce",
        f"{nbytes / 2**20:.2f} MiB across {world} ranks in {seconds * 1e3:.1f} ms (slowest rank): "
        f"bus bandwidth {mb(busbw)}{held}",
        bytes=nbytes,
        seconds=seconds,
        bus_bytes_per_s=busbw,
    )


def storage_check(path: str, write_error: str | None, unread: dict[str, str], nodes: int) -> Check:
    """Rank 0's token in the checkpoint directory, read back by every node (or the nodes that could not)."""
    fix = (
        "mount the same shared file system at the same path on every node (NFS, Lustre, a ReadWriteMany "
        "volume), or give --checkpoint-dir a path on it: a node that writes elsewhere cannot resume the job"
    )
    if write_error:
        return fail(
            "storage",
            f"rank 0 cannot write its token to {path}: {write_error}",
            "give --checkpoint-dir a directory rank 0 can write, on a file system every node mounts at the same path",
            path=path,
        )
    if unread:
        said = "; ".join(f"{label}: {why}" for label, why in unread.items())
        return fail("storage", f"{len(unread)} of {nodes} node(s) do not see rank 0's token: {said}", fix, path=path)
    return ok("storage", f"all {nodes} node(s) read the token rank 0 wrote to {path}: shared", path=path)
