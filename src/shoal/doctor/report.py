"""The doctor's report: one JSON document (``--json``; :data:`shoal.doctor.schema.SCHEMA`) and its text.

The same document serves both modes: ``mode`` is ``node`` (one node's checks) or ``cluster`` (rank 0
of a job: every node's checks, plus the cluster's own checks, the links, the job). Text is rendered
from the document, so the two never disagree.
"""

from __future__ import annotations

from typing import Any

from shoal.doctor.model import FAIL, OK, WARN, Check, NodeReport, counts, worst

SCHEMA_ID = "shoal-doctor/1"
LINK_ROWS = 28
"""Up to this many links (8 nodes) the text lists them all; beyond, only those that are not ok."""


def node_document(report: NodeReport) -> dict[str, Any]:
    status = report.status
    return {
        "schema": SCHEMA_ID,
        "mode": "node",
        "status": status,
        "counts": counts(report.checks),
        "nodes": [report.as_dict()],
        "cluster": None,
    }


def cluster_document(
    nodes: list[NodeReport], checks: list[Check], links: list[dict[str, Any]], job: dict[str, Any]
) -> dict[str, Any]:
    every = [*checks, *(c for node in nodes for c in node.checks)]
    return {
        "schema": SCHEMA_ID,
        "mode": "cluster",
        "status": worst(every),
        "counts": counts(every),
        "nodes": [node.as_dict() for node in nodes],
        "cluster": {**job, "checks": [c.as_dict() for c in checks], "links": links},
    }


def render_node(document: dict[str, Any]) -> str:
    """The one-node table: every check, with its HINT under it when it is not ok."""
    node = document["nodes"][0]
    lines = [f"shoal doctor: {node['host']}" + (f" ({node['address']})" if node.get("address") else "")]
    lines += _check_rows(node["checks"], indent="  ")
    names = {c["name"] for c in node["checks"]}
    if "route" not in names and "master-resolves" not in names:
        lines.append("  (give --master ADDR[:PORT] to check the route, the name and the port of the master node)")
    if node.get("plan"):
        lines.append(_plan_line(node["plan"]))
    lines.append(_footer(document))
    return "\n".join(lines)


def render_cluster(document: dict[str, Any]) -> str:
    """Rank 0's report: the job, each node (its non-ok checks in full), the cluster checks, the links."""
    job = document["cluster"]
    nodes = document["nodes"]
    lines = [
        f"shoal doctor: {job['nodes']} node(s), {job['world_size']} ranks ({job['scheme']}, master "
        f"{job['master']}), {job['elapsed_s']:.1f} s"
    ]
    lines.append("nodes:")
    for node in nodes:
        tally = counts(Check.from_dict(c) for c in node["checks"])
        said = ", ".join(f"{n} {s}" for s, n in tally.items() if n)
        where = f"  {node['address']}" if node.get("address") else ""
        listens = f", listens on {node['plan']['bind_addr']}" if node.get("plan") else ""
        ranks = _ranks(node["ranks"])
        lines.append(f"  {node['status']:<5} {_label(node)}{where}  {ranks}: {said}{listens}")
        lines += _check_rows([c for c in node["checks"] if c["status"] != OK], indent="        ")
    lines.append("cluster:")
    lines += _check_rows(job["checks"], indent="  ")
    links = job["links"]
    if links:
        shown = links if len(links) <= LINK_ROWS else [lk for lk in links if lk.get("status") != OK]
        hidden = len(links) - len(shown)
        lines.append("links (MB/s each way, round trip):" + (f" {hidden} more ok (--json lists all)" if hidden else ""))
        for link in shown:
            lines.append("  " + _link_row(link))
    lines.append(_footer(document))
    return "\n".join(lines)


def _check_rows(checks: list[dict[str, Any]], indent: str) -> list[str]:
    width = max((len(c["name"]) for c in checks), default=0)
    rows = []
    for check in checks:
        rows.append(f"{indent}{check['status']:<5} {check['name']:<{width}}  {check['summary']}")
        if check.get("hint"):
            rows.append(f"{indent}{'':<5} {'':<{width}}  HINT: {check['hint']}")
    return rows


def _link_row(link: dict[str, Any]) -> str:
    pair = f"{link['hosts'][0]} - {link['hosts'][1]}"
    if link.get("error"):
        return f"{pair:<32} fail: {link['error']}"
    speeds = f"{link['a_to_b'] / 1e6:,.1f} / {link['b_to_a'] / 1e6:,.1f}"
    status = "" if link.get("status") == OK else f"  {link.get('status')}: slow"
    return f"{pair:<32} {speeds:>22}  {link['rtt_s'] * 1e3:.2f} ms{status}"


def _plan_line(plan: dict[str, Any]) -> str:
    """What a job started here would do on the network, from :func:`shoal.doctor.network.plan_description`."""
    via = f" ({plan['interface']})" if plan.get("interface") else ""
    env = ", ".join(f"{k}={v}" for k, v in plan.get("environ", {}).items() if k.endswith("SOCKET_IFNAME"))
    workers = f"; its workers get {env}" if env else ""
    if not plan.get("store_port"):
        line = f"a one-node job started here listens on {plan['bind_addr']}{via} only, on ports the OS picks"
    else:
        role = f"node {plan['node_rank']}" if plan.get("node_rank") is not None else "a node"
        if plan.get("hosts_store"):
            does = f"serve the {plan['backend']} rendezvous store on {plan['bind_addr']}:{plan['store_port']}"
        else:
            does = f"join the {plan['backend']} rendezvous at {plan['endpoint']}"
        line = (
            f"as {role} of a job, this node would {does}, advertise {plan['advertise']} and listen on "
            f"{plan['bind_addr']}{via} only"
        )
    extra = "".join(f"\n  warning: {w}" for w in plan.get("warnings", []))
    return f"rendezvous plan: {line}{workers}{extra}"


def _footer(document: dict[str, Any]) -> str:
    tally = document["counts"]
    said = ", ".join(f"{tally[s]} {s}" for s in (FAIL, WARN, OK) if tally.get(s))
    verdict = {OK: "all checks pass", WARN: "warnings only", FAIL: "FAILED"}[document["status"]]
    return f"shoal doctor: {verdict} ({said})"


def _label(node: dict[str, Any]) -> str:
    return node["host"] if node.get("node_rank") is None else f"node {node['node_rank']} ({node['host']})"


def _ranks(ranks: list[int]) -> str:
    if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return f"rank{'s' if len(ranks) != 1 else ''} {', '.join(map(str, ranks))}"
