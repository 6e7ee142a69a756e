"""Cluster-wide verdicts from what the ranks sent rank 0: missing ranks, versions that differ, slow
links or nodes, the all-reduce, shared storage. Pure functions of plain data (tested without a job).

Rates are judged twice, and the worse verdict wins:

* *relative*: a node by its own links against the links among the others, each direction apart (a
  node that sends slowly is slow on every link, whatever the median link says: with three nodes a
  slow one sits on two of the three links, so the median link is its own); a link against the median
  link; with two nodes, one direction against the other. Slow means below :data:`SLOW_FRACTION` of
  the reference, a fail below :data:`FAIL_FRACTION`.
* *absolute*: the seconds a reference model's gradient all-reduce would take every step at the
  slowest rate (:mod:`shoal.distributed.bandwidth`, the scale the job's watchdog speaks too), so a
  cluster whose links are all equally slow is not "ok".
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any

from shoal.distributed.bandwidth import (
    REFERENCE_GRADIENT_BYTES,
    allreduce_seconds,
    bus_bytes_per_s,
    describe_step_cost,
    step_cost_status,
)
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
    """The measured links that look slow (a slow link, or a link of a slow node), slowest first."""
    measured = [lk for lk in links if not lk.get("error")]
    if len(measured) < 2:
        return []
    median = statistics.median(_slower(lk) for lk in measured)
    on_slow_node = {id(lk) for node in slow_nodes(measured) for lk in measured if node.node in (lk["a"], lk["b"])}
    slow = [lk for lk in measured if _slower(lk) < SLOW_FRACTION * median or id(lk) in on_slow_node]
    return sorted(slow, key=_slower)


@dataclass(frozen=True)
class SlowNode:
    """A node whose own links are slow in one direction (or both) while the links among the others are not."""

    node: int
    sends: bool
    receives: bool
    rate: float
    """The median of its slow direction's rates (bytes/s)."""
    others: float
    """The median rate of the directions between the other nodes (bytes/s)."""

    @property
    def ratio(self) -> float:
        return self.rate / self.others if self.others else 0.0

    def describe(self, labels: dict[int, str], links: int) -> str:
        way = "sends and receives" if self.sends and self.receives else "sends" if self.sends else "receives"
        return (
            f"{labels[self.node]} is slow: {mb(self.rate)} on all its {links} link{'s' if links != 1 else ''} "
            f"(it {way} slowly; the links between the other nodes: {mb(self.others)})"
        )


def slow_nodes(measured: list[dict[str, Any]]) -> list[SlowNode]:
    """The nodes judged by their own links against the others': a node is slow when even the fastest
    direction it sends (or receives) on is below :data:`SLOW_FRACTION` of the median of the
    directions that do not touch it. With two nodes nothing is left to compare with: none."""
    directions = [(lk["a"], lk["b"], lk["a_to_b"]) for lk in measured]
    directions += [(lk["b"], lk["a"], lk["b_to_a"]) for lk in measured]
    found = []
    for node in sorted({lk["a"] for lk in measured} | {lk["b"] for lk in measured}):
        others = [rate for src, dst, rate in directions if node not in (src, dst)]
        if not others:
            continue
        reference = statistics.median(others)
        sent = [rate for src, _, rate in directions if src == node]
        received = [rate for _, dst, rate in directions if dst == node]
        sends = bool(sent) and max(sent) < SLOW_FRACTION * reference
        receives = bool(received) and max(received) < SLOW_FRACTION * reference
        if sends or receives:
            rate = statistics.median((sent if sends else []) + (received if receives else []))
            found.append(SlowNode(node, sends, receives, rate, reference))
    return found


def link_checks(links: list[dict[str, Any]], labels: dict[int, str]) -> list[Check]:
    """``latency`` and ``bandwidth`` from the measured links; marks each link's ``status`` in place.

    Each link: ``{"a", "b"}`` (node ranks), ``rtt_s``, ``a_to_b`` / ``b_to_a`` (bytes/s) or ``error``.
    Two judgements, the worse one wins: *relative* (a node by its own links against the others', a
    link against the median link, one direction against the other), and *absolute*: what one
    gradient all-reduce of a reference model costs every step at the slowest rate measured
    (:mod:`shoal.distributed.bandwidth`, the scale the job's watchdog uses too).
    """
    if not links:
        return [ok("bandwidth", "one node: no link between nodes to measure")]
    broken = [lk for lk in links if lk.get("error")]
    measured = [lk for lk in links if not lk.get("error")]
    for link in measured:
        link["bytes_per_s"] = _slower(link)
        link["status"] = "ok"
    for link in broken:
        link["status"] = "fail"
    latency = _latency_check(measured, labels)
    if not measured:
        return [latency, _broken_check(broken, labels, [])]
    relative = _relative(measured, links, labels)
    if broken:
        return [latency, _broken_check(broken, labels, relative.named)]
    return [latency, _bandwidth_check(measured, links, labels, relative)]


@dataclass
class _Relative:
    """The relative judgement of the measured links: what it names as slow, and each one's status."""

    median: float
    """The median link's rate (bytes/s)."""
    nodes: list[SlowNode]
    named: list[str]
    statuses: list[str]
    by_median: bool
    """Some link was named slow against the median link."""


def _relative(measured: list[dict[str, Any]], links: list[dict[str, Any]], labels: dict[int, str]) -> _Relative:
    """Slow nodes by their own links, then links against the median link, then (two nodes) one
    direction against the other; marks each link's ``status`` in place."""
    median = statistics.median(lk["bytes_per_s"] for lk in measured)
    nodes = slow_nodes(measured)
    named, statuses = [], []
    for node in nodes:
        status = "fail" if node.ratio < FAIL_FRACTION else "warn"
        statuses.append(status)
        named.append(node.describe(labels, _degree(node.node, links)))
        for link in measured:
            if node.node in (link["a"], link["b"]):
                link["status"] = _worse(link["status"], status)
    slow_ends, by_median = {node.node for node in nodes}, False
    for link in measured:
        if (
            len(measured) > 1
            and link["bytes_per_s"] < SLOW_FRACTION * median
            and not slow_ends & {link["a"], link["b"]}
        ):
            link["status"] = _worse(link["status"], "fail" if link["bytes_per_s"] < FAIL_FRACTION * median else "warn")
            statuses.append(link["status"])
            named.append(f"the link {_pair(link, labels)} is slow: {mb(link['bytes_per_s'])}")
            by_median = True
    if len(measured) == 1:
        one_way = _one_way(measured[0], labels)
        if one_way:
            status, text = one_way
            measured[0]["status"] = status
            statuses.append(status)
            named.append(text)
    return _Relative(median, nodes, named, statuses, by_median)


def _bandwidth_check(
    measured: list[dict[str, Any]], links: list[dict[str, Any]], labels: dict[int, str], relative: _Relative
) -> Check:
    """``bandwidth``: the relative judgement's findings, or the absolute one's (what a reference
    model's all-reduce costs a step at the slowest rate), the worse status winning; else ok."""
    median = relative.median
    bottleneck = min(lk["bytes_per_s"] for lk in measured)
    participants = len({lk["a"] for lk in links} | {lk["b"] for lk in links})
    cost = step_cost_status(allreduce_seconds(REFERENCE_GRADIENT_BYTES, bottleneck, participants))
    costly = f"at {mb(bottleneck)} {describe_step_cost(bottleneck, participants)}" if cost != "ok" else ""
    if relative.named:
        status = fail if "fail" in relative.statuses or cost == "fail" else warn
        return status(
            "bandwidth",
            "; ".join(relative.named)
            + (f" (the links' median: {mb(median)})" if relative.by_median else "")
            + (f"; {costly}" if costly else ""),
            "look at that node's network: its link speed (`ethtool`), traffic shaping (`tc qdisc show`), "
            "errors (`ip -s link`), the switch port, or a CPU too busy to feed it; every step of the job "
            "waits for the slowest link",
            slow_nodes=[labels[node.node] for node in relative.nodes],
            median_bytes_per_s=median,
            bottleneck_bytes_per_s=bottleneck,
        )
    summary = f"{len(measured)} link(s): median {mb(median)}, slowest {mb(bottleneck)}"
    if cost != "ok":
        return (fail if cost == "fail" else warn)(
            "bandwidth",
            f"{summary}: every link is slow for data-parallel training: {costly}",
            "use a faster network between the nodes, or send fewer bytes per step: --comm-hook bf16 "
            "(half) or powersgd (far fewer; docs/BENCHMARKS.md, 'Slow networks'), a larger --grad-accum",
            slow_nodes=[],
            median_bytes_per_s=median,
            bottleneck_bytes_per_s=bottleneck,
        )
    return ok("bandwidth", summary, slow_nodes=[], median_bytes_per_s=median, bottleneck_bytes_per_s=bottleneck)


def _slower(link: dict[str, Any]) -> float:
    return min(link["a_to_b"], link["b_to_a"])


def _worse(a: str, b: str) -> str:
    order = ("ok", "warn", "fail")
    return max(a, b, key=order.index)


def _one_way(link: dict[str, Any], labels: dict[int, str]) -> tuple[str, str] | None:
    """Two nodes: one link, no other to compare with; a direction far slower than the other is named."""
    fast, slow = sorted((link["a_to_b"], link["b_to_a"]), reverse=True)
    if slow >= SLOW_FRACTION * fast:
        return None
    src, dst = (link["a"], link["b"]) if link["a_to_b"] == slow else (link["b"], link["a"])
    status = "fail" if slow < FAIL_FRACTION * fast else "warn"
    return status, f"{labels[src]} -> {labels[dst]} is slow: {mb(slow)}, the other way {mb(fast)}"


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


def _degree(node: int, links: list[dict[str, Any]]) -> int:
    return sum(node in (lk["a"], lk["b"]) for lk in links)


def _pair(link: dict[str, Any], labels: dict[int, str]) -> str:
    return f"{labels[link['a']]} - {labels[link['b']]}"


def allreduce_check(result: dict[str, Any], world: int, slow_nodes: list[str]) -> Check:
    """The all-reduce across every rank: right sums, and its bus bandwidth (what every link carried),
    judged on the absolute scale of :mod:`shoal.distributed.bandwidth` (the cost of a reference
    model's gradient all-reduce per step)."""
    if result.get("error"):
        return fail(
            "allreduce",
            f"the all-reduce across {world} ranks failed: {result['error']}",
            "a collective across all ranks did not complete: see the bandwidth check for the link that broke",
        )
    seconds, nbytes = result["seconds"], result["bytes"]
    busbw = bus_bytes_per_s(nbytes, seconds or 0.0, world)
    result["bus_bytes_per_s"] = busbw
    held = f" (held back by {', '.join(slow_nodes)})" if slow_nodes else ""
    summary = (
        f"{nbytes / 2**20:.2f} MiB across {world} ranks in {seconds * 1e3:.1f} ms (slowest rank): "
        f"bus bandwidth {mb(busbw)}{held}"
    )
    cost = step_cost_status(allreduce_seconds(REFERENCE_GRADIENT_BYTES, busbw, world))
    data = {"bytes": nbytes, "seconds": seconds, "bus_bytes_per_s": busbw}
    if cost == "ok":
        return ok("allreduce", summary, **data)
    return (fail if cost == "fail" else warn)(
        "allreduce",
        f"{summary}: {describe_step_cost(busbw, world, who='ranks')}",
        "every step waits that long for its gradients: fix the slow node or link (see the bandwidth check), or "
        "send fewer bytes: --comm-hook bf16 or powersgd (docs/BENCHMARKS.md, 'Slow networks')",
        **data,
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
