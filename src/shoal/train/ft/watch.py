"""The replica launcher's watch over its groups (:mod:`shoal.train.ft.supervisor`): a dead
group's one line, a hung group reported, and stragglers among the groups named.

The groups run outside torch's agent, so the launch core's :class:`~shoal.launch.watchdog.JobWatch`
does not see them. Each group writes the per-rank progress record every trainer writes
(:mod:`shoal.progress`, ``RUN_DIR/progress/rank-G.progress``, its group number as the rank), and
this watch reads this node's groups' records:

- a group that died is named with its node and the step of its last commit, in the launcher's line
  and as a ``died`` event in ``RUN_DIR/replicas.jsonl`` (:mod:`shoal.train.ft.events`), which ``shoal
  status`` shows;
- a group whose record has not changed for the hang timeout (the watchdog's
  :class:`~shoal.launch.watchdog.HangDetector`, judged for each group alone: the others go on
  without it) is reported once, report only: its stack saved under ``RUN_DIR/hang-<time>/``, one
  line, a ``hung`` event. The lighthouse drops a dead group within its heartbeat timeout; a hung
  one (stopped, or blocked with its heartbeat alive) is what it misses until the collective
  timeout, and nothing restarts it;
- a group whose compute per step stays above the other groups' is named a straggler, once per
  episode (the watchdog's :class:`~shoal.launch.watchdog.judges.StragglerWindows`: its margin, its
  windows, its persistence both ways): one line, a ``straggler`` event, and a ``caught_up`` event
  when it keeps pace again. Every step is synchronous across the groups, so a slow group makes
  every group's step as long as its own: only its compute tells it apart. Node 0's watch judges
  every group of the job (their records are all in the shared run directory); the others judge
  none, so that each straggler is said once.

A job without a run directory (a user's own loop) gets the lines without the step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from shoal.console import write_line
from shoal.launch.watchdog import HangDetector, activity, dump_stacks, where
from shoal.launch.watchdog.judges import Straggler, StragglerWindows
from shoal.launch.watchdog.options import straggler_window_s
from shoal.progress import RankProgress, progress_path, read_one, read_progress, run_progress_dir
from shoal.train.ft.events import COMMITTED, append_event, node_label, read_events

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
    window_s: float = field(default_factory=straggler_window_s)
    """The straggler window (``SHOAL_STRAGGLER_WINDOW_S``, 10 s by default, as the watchdog's)."""
    _detectors: dict[tuple[int, int], HangDetector] = field(default_factory=dict)
    _polled_at: float = -float("inf")
    _stragglers: StragglerWindows = field(default_factory=StragglerWindows)
    _window_at: float | None = None
    _pids: dict[int, int] = field(default_factory=dict)  # group -> the process whose record was judged

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
        """Look at the live groups (group -> pid) every ``interval_s``, and on node 0 at every group's
        record every ``window_s``; the lines of hangs and stragglers reported now."""
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
        if self.node == 0:
            if self._window_at is None:
                self._window_at = now
            elif now - self._window_at >= self.window_s:
                self._window_at = now
                lines += self._judge_stragglers()
        return lines

    def _judge_stragglers(self) -> list[str]:
        """One straggler window over every group's record (this node's and the others', read from the
        shared run directory): the lines of groups named, or keeping pace again, now."""
        assert self.run_dir is not None
        records = [r for r in read_progress(run_progress_dir(self.run_dir)) if r.phase != "done"]
        for r in records:
            if self._pids.setdefault(r.rank, r.pid) != r.pid:  # a restarted group: a new process, no past
                self._stragglers.forget(r.rank)
                self._pids[r.rank] = r.pid
        named, left = self._stragglers.window(records)
        if not named and not left:
            return []
        places = _places(read_events(self.run_dir))
        steps = {r.rank: (r.pid, r.step) for r in records}
        lines = []
        for straggler in named:
            lines.append(self._straggler(straggler, places, *steps[straggler.rank]))
        for group in left:
            node, address = places.get(group, (None, None))
            pid, step = steps[group]
            append_event(self.run_dir, group, "caught_up", pid=pid, step=step, node=node, address=address)
            lines.append(
                f"shoal: replica group {group} on {node_label(node, address)} keeps pace with the others again"
            )
            write_line(lines[-1])
        return lines

    def _straggler(self, s: Straggler, places: dict[int, tuple], pid: int, step: int) -> str:
        assert self.run_dir is not None
        node, address = places.get(s.rank, (None, s.host))
        append_event(
            self.run_dir, s.rank, "straggler", pid=pid, step=step, ratio=round(s.ratio, 2),
            compute_s=round(s.mean, 6), others_s=round(s.others, 6), steps=s.steps, node=node, address=address,
        )  # fmt: skip
        line = (
            f"shoal: replica group {s.rank} on {node_label(node, address)} is a straggler: {s.ratio:.1f}x the "
            f"other groups' compute per step ({s.mean * 1e3:.1f} ms vs {s.others * 1e3:.1f} ms, their median) "
            f"over its last {s.steps} steps; every group's step waits for it"
        )
        write_line(line)
        return line

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


def _places(events: list[dict]) -> dict[int, tuple]:
    """group -> (node, address) of its latest start, from the events."""
    return {e["group"]: (e.get("node"), e.get("address")) for e in events if e["event"] == "start"}
