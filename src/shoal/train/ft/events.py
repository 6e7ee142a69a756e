"""``RUN_DIR/replicas.jsonl``: what the replica groups of a fault-tolerant job lived through, and
where each one stands, read back without torch (``shoal status``).

One JSON object a line, appended with one ``write`` each (lines of several processes do not
interleave): ``{"t", "group", "event", "pid", ...}``. The groups write ``start`` (with their node,
address and the lighthouse's URL), ``joined``, ``healed``, ``quorum``, ``dropped``, ``recovered`` and
``finished`` (:mod:`shoal.train.ft.loop`); their launcher writes ``died`` (the group's pid, how it
ended, the step of its last commit), ``hung``, ``straggler`` (its compute per step against the
other groups' median: ``ratio``, ``compute_s``, ``others_s`` over its last ``steps`` steps) and
``caught_up`` (the straggler keeps pace again): :mod:`shoal.train.ft.watch`. Every ``step``
but a ``dropped`` one is a count of committed steps.

Nothing here imports torch, nor anything of shoal.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EVENTS_FILE = "replicas.jsonl"
NODE_ENV = "SHOAL_REPLICA_NODE"
"""The node rank of a group's launcher, set in each group's process."""
COMMITTED = frozenset({"healed", "joined", "quorum", "recovered", "finished", "died"})
"""Events whose ``step`` is a count of committed steps (a ``dropped`` step's is the step tried)."""


def append_event(run_dir: str | os.PathLike, group: int, event: str, pid: int | None = None, **fields: Any) -> None:
    """One event line in ``run_dir``'s :data:`EVENTS_FILE` (``pid``: default, this process)."""
    line = {"t": time.time(), "group": group, "event": event, "pid": os.getpid() if pid is None else pid, **fields}
    fd = os.open(Path(run_dir) / EVENTS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def read_events(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Every event of ``run_dir``, in order; a line being written (or torn) is skipped."""
    try:
        text = (Path(run_dir) / EVENTS_FILE).read_text()
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and isinstance(event.get("group"), int):
            found.append(event)
    return found


def finished_without(events: list[dict[str, Any]], group: int) -> dict[str, Any] | None:
    """Another group's ``finished`` event written after ``group``'s last ``start`` (its previous
    process's), if any: the job ended while ``group`` was being restarted."""
    starts = [e["t"] for e in events if e["group"] == group and e["event"] == "start"]
    if not starts:
        return None
    since = max(starts)
    done = [e for e in events if e["group"] != group and e["event"] == "finished" and e["t"] > since]
    return done[-1] if done else None


def node_label(node: int | None, address: str | None) -> str:
    """``node 1 (10.0.0.2)``: a group's node as its lines name it."""
    if node is None:
        return f"node {address}" if address else "node ?"
    return f"node {node} ({address})" if address else f"node {node}"


@dataclass(frozen=True)
class GroupState:
    """One replica group as its events tell it (``shoal status``)."""

    group: int
    node: str
    """:func:`node_label` of its latest start."""
    pid: int
    """Its latest process."""
    starts: int
    step: int
    """Its last committed step (a count of committed steps), from the events."""
    state: str
    """``training``, ``finished``, or ``dead, restarting`` (its launcher said it died, and no
    start came since)."""
    died: dict[str, Any] | None
    """Its latest ``died`` event (``step``, ``how``, ``after_s``, ``node``): the end of its previous
    life, or of this one while it is ``dead, restarting``; None if it never died."""
    healed: dict[str, Any] | None
    """Its current process's ``healed`` event (``step``, ``after_s``, ``source``), or None: never
    one of an earlier life."""
    straggler: dict[str, Any] | None = None
    """Its ``straggler`` event while that episode lasts (no ``caught_up``, start, death or end
    since): ``ratio``, ``compute_s``, ``others_s``, ``steps``; else None."""

    def failure(self) -> str:
        """One line: which node, which step it died at, where it healed and how long that took."""
        if self.died is None:
            return "-"
        died = self.died
        at = f" at step {died['step']}" if died.get("step") is not None else ""
        text = f"{died.get('how', 'died')}{at}"
        healed = self.healed
        if healed is not None and healed["t"] > died["t"]:
            how = {"checkpoint": "resumed from its checkpoint", "start": "joined"}.get(healed.get("source"), "healed")
            text += f"; {how} at step {healed['step']} after {healed['after_s']:.1f} s"
        return text


def group_states(events: list[dict[str, Any]]) -> list[GroupState]:
    """Each group's :class:`GroupState`, by group number."""
    by_group: dict[int, list[dict[str, Any]]] = {}
    for event in events:
        by_group.setdefault(event["group"], []).append(event)
    states = []
    for group, mine in sorted(by_group.items()):
        starts = [e for e in mine if e["event"] == "start"]
        start = starts[-1] if starts else {}
        last = mine[-1]
        if last["event"] == "finished":
            state = "finished"
        elif last["event"] == "died":
            state = "dead, restarting"
        else:
            state = "training"
        steps = [e["step"] for e in mine if e["event"] in COMMITTED and isinstance(e.get("step"), int)]
        pid = int(start.get("pid", last["pid"]))
        died = [e for e in mine if e["event"] == "died"]
        healed = [e for e in mine if e["event"] == "healed" and e["pid"] == pid]  # this life's
        states.append(
            GroupState(
                group=group,
                node=node_label(start.get("node"), start.get("address")),
                pid=pid,
                starts=int(start.get("starts", len(starts))),
                step=max(steps, default=0),
                state=state,
                died=died[-1] if died else None,
                healed=healed[-1] if healed else None,
                straggler=_straggling(mine),
            )
        )
    return states


def _straggling(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A group's latest ``straggler`` event, unless an event since ended that episode."""
    for event in reversed(events):
        if event["event"] == "straggler":
            return event
        if event["event"] in ("caught_up", "start", "died", "finished"):
            return None
    return None


def lighthouse_url(events: list[dict[str, Any]]) -> str | None:
    """The lighthouse the groups last started against, if they said."""
    urls = [e["lighthouse"] for e in events if e["event"] == "start" and e.get("lighthouse")]
    return urls[-1] if urls else None
