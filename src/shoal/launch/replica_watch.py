"""The replica launcher's watch over its groups (:mod:`shoal.launch.replica_groups`): a dead
group's one line, and a hung group reported.

The groups run outside torch's agent, so the launch core's :class:`~shoal.launch.watchdog.JobWatch`
does not see them. Each group writes the per-rank progress record every trainer writes
(:mod:`shoal.progress`, ``RUN_DIR/progress/rank-G.progress``, its group number as the rank), and
this watch reads this node's groups' records:

- a group that died is named with its node and the step of its last commit, in the launcher's line
  and as a ``died`` event in ``RUN_DIR/replicas.jsonl`` (:mod:`shoal.replica_log`), which ``shoal
  status`` shows;
- a group whose record has not changed for the hang timeout (the watchdog's
  :class:`~shoal.launch.watchdog.HangDetector`, judged for each group alone: the others go on
  without it) is reported once, report only: its stack saved under ``RUN_DIR/hang-<time>/``, one
  line, a ``hung`` event. The lighthouse drops a dead group within its heartbeat timeout; a hung
  one (stopped, or blocked with its heartbeat alive) is what it misses until the collective
  timeout, and nothing restarts it.

A job without a run directory (a user's own loop) gets the lines without the step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from shoal.console import write_line
from shoal.launch.watchdog import HangDetector, activity, dump_stacks, where
from shoal.progress import RankProgress, progress_path, read_one, run_progress_dir
from shoal.replica_log import COMMITTED, append_event, node_label, read_events

_STACK_TIMEOUT_S = 2.0
"""The longest the launcher waits for a hung group's stack (it restarts dead groups meanwhile)."""


@dataclass
class GroupWatch:
    """This node's groups seen from their launcher: :meth:`died` when one ended, :meth:`poll` often."""

    run_dir: Path | None
    """The run's directory (``shoal train``'s ``--out``); None for a user's own loop."""
    node: int
    address: str
    hang_timeout: float | None = None
    """Seconds without progress before a group is reported; None: the watchdog's rule (30 s at least,
    10 x the group's step time)."""
    interval_s: float = 1.0
    _detectors: dict[tuple[int, int], HangDetector] = field(default_factory=dict)
    _polled_at: float = -float("inf")

    @property
    def label(self) -> str:
        return node_label(self.node, self.address)

    def record(self, group: int, pid: int) -> RankProgress | None:
        """The group's progress record, if the process ``pid`` wrote it."""
        if self.run_dir is None:
            return None
        found = read_one(progress_path(run_progress_dir(self.run_dir), group))
        return found if found is not None and found.pid == pid else None

    def last_commit(self, group: int, pid: int) -> int | None:
        """The step of the last commit of process ``pid`` of ``group``: its progress record, else its
        events; None when neither says."""
        found = self.record(group, pid)
        if found is not None:
            return found.step
        if self.run_dir is None:
            return None
        steps = [
            e["step"]
            for e in read_events(self.run_dir)
            if e["group"] == group and e["pid"] == pid and e["event"] in COMMITTED and isinstance(e.get("step"), int)
        ]
        return max(steps, default=None)

    def died(self, group: int, pid: int, how: str, after_s: float) -> str:
        """Group ``group``'s process ``pid`` ended (``how``: ``was killed by SIGKILL``): the ``died``
        event written, and the middle of the launcher's line (``on node 0 (127.0.0.1) at step 42
        (its last commit), 24.1 s after it started``)."""
        step = self.last_commit(group, pid)
        self._detectors.pop((group, pid), None)
        if self.run_dir is not None:
            append_event(
                self.run_dir, group, "died", pid=pid, how=how.removeprefix("was "), step=step,
                after_s=round(after_s, 3), node=self.node, address=self.address,
            )  # fmt: skip
        at = f" at step {step} (its last commit)" if step is not None else ""
        return f"on {self.label}{at}, {after_s:.1f} s after it started"

    def poll(self, live: dict[int, int], now: float | None = None) -> list[str]:
        """Look at the live groups (group -> pid) every ``interval_s``; the lines of hangs reported now."""
        now = time.monotonic() if now is None else now
        if now - self._polled_at < self.interval_s or self.run_dir is None:
            return []
        self._polled_at = now
        lines = []
        for group, pid in sorted(live.items()):
            found = self.record(group, pid)
            if found is None:
                continue
            detector = self._detectors.setdefault((group, pid), HangDetector(timeout_s=self.hang_timeout))
            hang = detector.observe(now, [found])
            if hang is not None:
                lines.append(self._report(found, hang.stalled_s, hang.timeout_s))
        return lines

    def _report(self, found: RankProgress, stalled_s: float, timeout_s: float) -> str:
        assert self.run_dir is not None
        group = found.rank
        directory = self.run_dir / f"hang-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
        directory.mkdir(parents=True, exist_ok=True)
        stack = dump_stacks(found, _STACK_TIMEOUT_S)
        place = where(stack) if stack else ""
        head = f"replica group {group} pid {found.pid} {self.label} step {found.step} phase {activity(found)}\n\n"
        text = stack or "(no stack: the group did not answer the stacks signal: stopped, or blocked in C)\n"
        (directory / f"group-{group}.txt").write_text(head + text)
        append_event(
            self.run_dir, group, "hung", pid=found.pid, step=found.step, phase=activity(found),
            stalled_s=round(stalled_s, 1), node=self.node, address=self.address, stacks=str(directory),
        )  # fmt: skip
        line = (
            f"shoal: replica group {group} (pid {found.pid}) on {self.label} made no progress for {stalled_s:.0f} s "
            f"(hang timeout {timeout_s:.0f} s): in {activity(found)} at step {found.step}"
            f"{f' at {place}' if place else ''}; the other groups go on without it; stack: {directory}"
        )
        write_line(line)
        return line
