"""What a check says, and what a node reports: plain data, shared by every check and by the report.

A :class:`Check` is one row of the table: a stable ``name`` (what scripts key on), a ``status``
(``ok``, ``warn`` or ``fail``), one line saying what was found, a ``HINT`` with the fix when it is
not ok, and the measured values in ``data``. A :class:`NodeReport` is one node's rows plus who it
is; it travels between ranks as JSON (:meth:`NodeReport.as_dict` / :meth:`NodeReport.from_dict`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

OK, WARN, FAIL = "ok", "warn", "fail"
STATUSES = (OK, WARN, FAIL)
"""In order of severity."""


@dataclass(frozen=True)
class Check:
    """One check's verdict."""

    name: str
    """A stable identifier (``shm``, ``master-port``...): see docs/DOCTOR.md."""
    status: str
    """``ok``, ``warn`` or ``fail``."""
    summary: str
    """One line: what was found, naming the value, the file, the interface or the node."""
    hint: str | None = None
    """How to fix it (only when the status is not ``ok``)."""
    data: dict[str, Any] = field(default_factory=dict)
    """The measured values, for machines (bytes, seconds, names)."""

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "summary": self.summary, "hint": self.hint, "data": self.data}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Check:
        return cls(d["name"], d["status"], d["summary"], d.get("hint"), dict(d.get("data") or {}))


def ok(name: str, summary: str, **data: Any) -> Check:
    return Check(name, OK, summary, None, data)


def warn(name: str, summary: str, hint: str, **data: Any) -> Check:
    return Check(name, WARN, summary, hint, data)


def fail(name: str, summary: str, hint: str, **data: Any) -> Check:
    return Check(name, FAIL, summary, hint, data)


def worst(checks: Iterable[Check]) -> str:
    """The most severe status among ``checks`` (``ok`` for none)."""
    return max((c.status for c in checks), key=STATUSES.index, default=OK)


def counts(checks: Iterable[Check]) -> dict[str, int]:
    found = {status: 0 for status in STATUSES}
    for check in checks:
        found[check.status] += 1
    return found


@dataclass
class NodeReport:
    """One node's (or one rank's) checks and who it is."""

    host: str
    """The host name (``socket.gethostname()``)."""
    checks: list[Check]
    versions: dict[str, str] = field(default_factory=dict)
    """Software versions that must agree across nodes (python, torch, cuda, nccl, shoal)."""
    address: str | None = None
    """This node's address on the way to the master (None without one)."""
    node_rank: int | None = None
    ranks: list[int] = field(default_factory=list)
    """The global ranks that run on this node (cluster mode)."""
    plan: dict[str, Any] | None = None
    """What a job started here listens on and advertises (see :func:`shoal.doctor.network.plan_description`)."""

    @property
    def status(self) -> str:
        return worst(self.checks)

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)

    def label(self) -> str:
        """``node 2 (n2)``, or the host name alone outside a job."""
        return self.host if self.node_rank is None else f"node {self.node_rank} ({self.host})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "node_rank": self.node_rank,
            "ranks": self.ranks,
            "address": self.address,
            "status": self.status,
            "versions": self.versions,
            "checks": [c.as_dict() for c in self.checks],
            "plan": self.plan,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NodeReport:
        return cls(
            host=d["host"],
            checks=[Check.from_dict(c) for c in d["checks"]],
            versions=dict(d.get("versions") or {}),
            address=d.get("address"),
            node_rank=d.get("node_rank"),
            ranks=list(d.get("ranks") or []),
            plan=d.get("plan"),
        )
