"""``shoal doctor`` across nodes: what every rank of the job does, and rank 0's report.

The ranks talk through two channels. Messages being measured go through torch.distributed (the
job's own path); everything else (each rank's checks, the probe schedule, the measurements) goes
through the job's rendezvous store, a TCPStore that every launcher already runs for the job, as
JSON under ``shoal-doctor/<restart>/``. So rank 0 still gets every report when a link between two
nodes is broken, and names the ranks whose report never came instead of waiting for them.

Phases, each bounded (``--probe-timeout`` per wait; the link probes together by :func:`probe_budget`):

1. every rank checks itself (:func:`shoal.doctor.node.node_report`) and posts it;
2. rank 0 groups ranks into nodes (one leader each: its lowest rank), writes the storage token and
   posts the schedule: every pair of leaders, in rounds of disjoint pairs;
3. leaders read the token back and probe their pairs (:class:`shoal.doctor.probes.PairProber`);
4. rank 0 sizes the all-reduce to the slowest link; every rank runs it;
5. rank 0 judges (:mod:`shoal.doctor.verdicts`) and prints one report (:mod:`shoal.doctor.report`).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from datetime import timedelta
from typing import Any

from shoal.doctor import verdicts
from shoal.doctor.model import FAIL, Check, NodeReport
from shoal.doctor.node import node_report
from shoal.doctor.probes import (
    ALLREDUCE_ITERS,
    Clock,
    PairProber,
    allreduce_probe,
    read_token,
    round_robin,
    write_token,
)
from shoal.doctor.report import cluster_document, render_cluster
from shoal.doctor.settings import DoctorSettings
from shoal.errors import ShoalError

ALLREDUCE_TARGET_S = 0.25
"""The all-reduce is sized so that one takes about this long over the slowest link measured."""
PASSES = 2
"""Every link is probed this many times, in separate rounds; its best figures count. A moment of CPU
contention (another process scheduled on the core) slows one probe, not both: only a link that is
slow every time is named."""
CONFIRM_MAX = 8
"""Links that still look slow after the rounds (where the pairs of a round share the machines' CPUs
and switches) are probed once more each, alone; at most this many, the slowest first."""


def probe_budget(settings: DoctorSettings) -> float:
    """Seconds the link probes may take together: pairs that have not finished by then are reported."""
    return max(30.0, 3 * settings.probe_timeout)


def run_rank(settings: DoctorSettings, json_output: bool = False, plan: dict[str, Any] | None = None) -> int:
    """One rank of ``shoal doctor`` in a running job; rank 0 prints the report. Exit status: 1 on a fail."""
    import shoal

    started = time.monotonic()
    ctx = shoal.init(timeout=settings.probe_timeout)
    try:
        if ctx.world_size == 1:
            raise ShoalError(
                "shoal doctor across nodes needs a job of 2 or more processes; this one has 1",
                "run `shoal doctor` alone for this node's checks, or start it with --nnodes or under a launcher",
            )
        return _Rank(ctx, settings, plan).run(json_output, started)
    finally:
        ctx.shutdown()


class _Rank:
    def __init__(self, ctx: Any, settings: DoctorSettings, plan: dict[str, Any] | None) -> None:
        self.ctx, self.settings, self.plan = ctx, settings, plan
        self.rank, self.world = ctx.rank, ctx.world_size
        self.timeout = settings.probe_timeout
        self.store = _control_store(ctx.environment, self.timeout)
        self.missing: dict[str, list[int]] = {}

    def run(self, json_output: bool, started: float) -> int:
        info = self.ctx.environment
        mine = node_report(
            self.settings,
            nproc=self.ctx.local_world_size,
            master=(info.main_address, None),
            node_rank=info.node_rank,
            ranks=(self.rank,),
            across_nodes=info.num_nodes > 1,
        )
        mine.plan = self.plan
        self._post(f"node/{self.rank}", mine.as_dict())
        if self.rank == 0:
            self._schedule()
        schedule = self._get("schedule", self.timeout * 3)
        clock = Clock(time.monotonic() + schedule["budget_s"], self.timeout)
        leaders = schedule["leaders"]
        if self.rank in leaders:
            self._post(f"p2p/{self.rank}", self._probe_links(schedule, clock))
        if self.rank == 0:
            self._pick_suspects(schedule, clock)
        if self.rank in leaders:
            self._confirm(schedule["budget_s"])
        if self.rank == 0:
            self._size_allreduce(schedule["budget_s"])
        sizing = self._get("allreduce", 2 * schedule["budget_s"] + 3 * self.timeout)
        result = allreduce_probe(
            sizing["bytes"], sizing["iters"], rank=self.rank, world=self.world, device=self.ctx.device,
            clock=Clock(time.monotonic() + self.timeout * (sizing["iters"] + 1), self.timeout),
        )  # fmt: skip
        self._post(f"ar/{self.rank}", result)
        if self.rank != 0:
            return 0
        document = self._report(time.monotonic() - started)
        text = json.dumps(document, indent=1) if json_output else render_cluster(document)
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        return 1 if document["status"] == FAIL else 0

    # --- rank 0 -------------------------------------------------------------------------------

    def _schedule(self) -> None:
        reports = self._collect("node", range(self.world), self.timeout)
        self.nodes = _by_node(reports)
        leaders = [node.ranks[0] for node in self.nodes]
        self.token = uuid.uuid4().hex
        self.token_path, self.token_error = write_token(self.settings.checkpoint_dir, self.token)
        self.labels = {node.ranks[0]: node.label() for node in self.nodes}
        rounds = [[(leaders[a], leaders[b]) for a, b in pairs] for pairs in round_robin(len(leaders))]
        token = None if self.token_error else {"path": self.token_path, "value": self.token}
        schedule = {"leaders": leaders, "labels": self.labels, "rounds": rounds, "token": token}
        self._post("schedule", {**schedule, "budget_s": probe_budget(self.settings)})

    def _pick_suspects(self, schedule: dict[str, Any], clock: Clock) -> None:
        """The links that looked slow in the rounds: each is probed again, alone (see :data:`CONFIRM_MAX`)."""
        self.p2p = self._collect("p2p", schedule["leaders"], max(0.0, clock.deadline - time.monotonic()) + self.timeout)
        self.link_labels = {int(k): v for k, v in schedule["labels"].items()}
        self.links = _links(self.p2p, self.link_labels, self.nodes)
        self.suspects = [link["ranks"] for link in verdicts.suspect_links(self.links)[:CONFIRM_MAX]]
        self._post("confirm", self.suspects)

    def _size_allreduce(self, budget: float) -> None:
        involved = sorted({rank for pair in self.suspects for rank in pair})
        confirmed = self._collect("confirmed", involved, budget + self.timeout)
        for rank, found in confirmed.items():  # a second look that failed keeps the first look's figures
            self.p2p.setdefault(rank, {}).setdefault("pairs", []).extend(p for p in found if not p.get("error"))
        if confirmed:
            self.links = _links(self.p2p, self.link_labels, self.nodes)
        rates = [min(lk["a_to_b"], lk["b_to_a"]) for lk in self.links if not lk.get("error")]
        cap = int(self.settings.probe_mb * 2**20)
        nbytes = cap
        if rates:
            share = 2 * (self.world - 1) / self.world
            nbytes = int(min(cap, max(64 << 10, min(rates) * ALLREDUCE_TARGET_S / share)))
        self._post("allreduce", {"bytes": nbytes // 4 * 4, "iters": ALLREDUCE_ITERS})

    def _report(self, elapsed: float) -> dict[str, Any]:
        labels = {node.node_rank: node.label() for node in self.nodes}
        ars = self._collect("ar", range(self.world), self.timeout)
        checks: list[Check] = [verdicts.arrivals_check(self.world, self.missing, self.timeout)]
        checks.append(verdicts.versions_check(self.nodes))
        checks += verdicts.link_checks(self.links, labels)
        slow = next((c.data.get("slow_nodes", []) for c in checks if c.name == "bandwidth"), [])
        checks.append(verdicts.allreduce_check(_slowest(ars), self.world, slow))
        unread = {}
        for node in self.nodes:
            found = self.p2p.get(node.ranks[0]) or {}
            if "storage" in found and found["storage"]:
                unread[node.label()] = found["storage"]
            elif not self.token_error and node.ranks[0] not in self.p2p:
                unread[node.label()] = "sent no result"
        checks.append(verdicts.storage_check(self.token_path, self.token_error, unread, len(self.nodes)))
        if not self.token_error:
            try:
                os.unlink(self.token_path)
            except OSError:
                pass
        info = self.ctx.environment
        job = {
            "world_size": self.world, "nodes": len(self.nodes), "scheme": info.scheme,
            "master": f"{info.main_address}:{info.main_port}", "elapsed_s": round(elapsed, 2),
        }  # fmt: skip
        return cluster_document(self.nodes, checks, self.links, job)

    # --- every leader -------------------------------------------------------------------------

    def _probe_links(self, schedule: dict[str, Any], clock: Clock) -> dict[str, Any]:
        labels = {int(k): v for k, v in schedule["labels"].items()}
        token = schedule["token"]
        found: dict[str, Any] = {"storage": read_token(token["path"], token["value"]) if token else None}
        self.prober = PairProber(self.ctx.device, int(self.settings.probe_mb * 2**20), clock)
        self.labels = labels
        pairs = []
        for round_pairs in schedule["rounds"] * PASSES:
            for a, b in round_pairs:
                if self.rank in (a, b):
                    peer = b if self.rank == a else a
                    pairs.append(self.prober.run_pair(self.rank, peer, labels.get(peer, f"rank {peer}")))
        found["pairs"] = pairs
        return found

    def _confirm(self, budget: float) -> None:
        """Probe the suspect links again, one after the other across the whole job (the previous one's
        lower rank posts ``turn/<k>`` when done), so that no other pair competes with them."""
        suspects = self._get("confirm", budget + 2 * self.timeout)
        clock = self.prober.clock = Clock(time.monotonic() + budget, self.timeout)
        mine = []
        for k, (a, b) in enumerate(suspects):
            if self.rank not in (a, b):
                continue
            if k:
                try:
                    self.store.wait([f"turn/{k - 1}"], timedelta(seconds=max(0.05, clock.deadline - time.monotonic())))
                except RuntimeError:
                    pass  # out of time: the probe below says so
            peer = b if self.rank == a else a
            mine.append(self.prober.run_pair(self.rank, peer, self.labels.get(peer, f"rank {peer}")))
            if self.rank == a:
                self.store.set(f"turn/{k}", "done")
        if mine:
            self._post(f"confirmed/{self.rank}", mine)

    # --- the store ------------------------------------------------------------------------------

    def _post(self, key: str, value: Any) -> None:
        self.store.set(key, json.dumps(value))

    def _get(self, key: str, timeout: float) -> Any:
        try:
            self.store.wait([key], timedelta(seconds=timeout))
        except RuntimeError:
            raise ShoalError(
                f"rank {self.rank}: rank 0 did not post the doctor's {key} within {timeout:g} s",
                "look at rank 0's node: it stopped or could not reach the others",
                exit_code=1,
            ) from None
        return json.loads(self.store.get(key))

    def _collect(self, phase: str, ranks: Any, timeout: float) -> dict[int, Any]:
        """``phase/<rank>`` of every rank in ``ranks``, waiting at most ``timeout`` in all."""
        deadline = time.monotonic() + timeout
        found: dict[int, Any] = {}
        for rank in ranks:
            try:
                self.store.wait([f"{phase}/{rank}"], timedelta(seconds=max(0.05, deadline - time.monotonic())))
                found[rank] = json.loads(self.store.get(f"{phase}/{rank}"))
            except RuntimeError:
                self.missing.setdefault(phase, []).append(rank)
        return found


def _control_store(info: Any, timeout: float) -> Any:
    """A client of the job's own store (the one its ranks joined through), under shoal-doctor/<restart>/."""
    import torch.distributed as dist

    store = dist.TCPStore(
        info.main_address, info.main_port, is_master=False, timeout=timedelta(seconds=timeout), wait_for_workers=False
    )
    return dist.PrefixStore(f"shoal-doctor/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/", store)


def _by_node(reports: dict[int, dict[str, Any]]) -> list[NodeReport]:
    """One report per node: its lowest rank's, with the checks in which another of its ranks differs."""
    nodes: dict[int, NodeReport] = {}
    for rank in sorted(reports):
        report = NodeReport.from_dict(reports[rank])
        key = report.node_rank if report.node_rank is not None else rank
        if key not in nodes:
            nodes[key] = report
            continue
        leader = nodes[key]
        leader.ranks.append(rank)
        for check in report.checks:
            own = leader.check(check.name)
            if own is None or (own.status, own.summary) != (check.status, check.summary):
                leader.checks.append(
                    Check(check.name, check.status, f"rank {rank}: {check.summary}", check.hint, check.data)
                )
    return [nodes[k] for k in sorted(nodes)]


def _links(p2p: dict[int, dict[str, Any]], labels: dict[int, str], nodes: list[NodeReport]) -> list[dict[str, Any]]:
    """Both sides' measurements of each pair of leaders, as one link between node ranks."""
    node_of = {node.ranks[0]: node.node_rank for node in nodes}
    sides: dict[tuple[int, int], dict[str, Any]] = {}
    for rank, found in p2p.items():
        for pair in found.get("pairs", []):
            a, b = sorted((rank, pair["peer"]))
            link = sides.setdefault((a, b), _link(a, b, node_of, labels))
            if "rtt_s" in pair:  # the best of the passes
                link["rtt_s"] = min(pair["rtt_s"], link.get("rtt_s", float("inf")))
            if "sent" in pair:
                key = "a_to_b" if rank == a else "b_to_a"
                link[key] = max(pair["sent"]["bytes_per_s"], link.get(key, 0.0))
            if pair.get("error"):
                link.setdefault("error", f"{labels.get(rank, rank)}: {pair['error']}")
    for link in sides.values():
        if not link.get("error") and not all(k in link for k in ("rtt_s", "a_to_b", "b_to_a")):
            link["error"] = "incomplete: a side sent no result"
    expected = {(a, b) for a in node_of for b in node_of if a < b}
    for a, b in sorted(expected - set(sides)):
        sides[(a, b)] = {**_link(a, b, node_of, labels), "error": "never measured"}
    return [sides[k] for k in sorted(sides)]


def _link(a: int, b: int, node_of: dict[int, int | None], labels: dict[int, str]) -> dict[str, Any]:
    """A link between the nodes of leaders ``a`` < ``b``: node ranks, leader ranks, labels."""
    return {"a": node_of.get(a, a), "b": node_of.get(b, b), "ranks": [a, b], "hosts": [labels.get(a), labels.get(b)]}


def _slowest(results: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The all-reduce as the job saw it: an error or a wrong sum anywhere, else the slowest rank's time."""
    for rank, found in sorted(results.items()):
        if found.get("error"):
            return {**found, "error": f"rank {rank}: {found['error']}"}
    timed = [found for found in results.values() if found.get("seconds")]
    if not timed:
        return {"error": "no rank reported a time"}
    return max(timed, key=lambda found: found["seconds"])
