"""What the watchdog judges, over data (the progress records of :mod:`shoal.progress`; no process is
touched here, so all of it is testable over snapshots):

- hangs: :class:`HangDetector` decides from successive snapshots that no rank made progress for the
  hang timeout, and :func:`hang_report` names the odd rank(s) out with the source line from their
  stacks (:func:`where`);
- stragglers: :class:`StragglerJudge` names a rank whose compute time per step stays above the
  others' by a margin for several windows in a row; :class:`StragglerWindows` feeds it each window
  from successive snapshots of the records and keeps who is named (the launch core's monitor and the
  replica launcher's watch over its groups both judge through it); :func:`straggler_line` says so in
  one line."""

from __future__ import annotations

import os
import re
import statistics
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from shoal.launch.watchdog.options import HANG_FACTOR, HANG_FLOOR_S, SLOW_FACTOR, SLOW_PHASES, WARMUP_STEPS
from shoal.progress import RankProgress


def format_ranks(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    ranks = sorted(ranks)
    spans: list[str] = []
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        spans.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ", ".join(spans)


@dataclass
class Hang:
    """No rank progressed for ``stalled_s`` (at least the timeout ``timeout_s``)."""

    stalled_s: float
    timeout_s: float
    ranks: list[RankProgress]


@dataclass
class HangDetector:
    """Feed it snapshots (:meth:`observe`); it says when no rank made progress for the timeout.

    Progress is any change of a rank's record (a phase entered, a step done), on the detector's own
    clock, so records from other nodes' clocks compare fine. The timeout is ``timeout_s`` when given,
    else ``max(floor_s, factor x the median step time)`` once every rank has done ``warmup_steps``
    steps, else ``floor_s``; ``SLOW_FACTOR`` times that when every rank is in a slow phase.
    """

    timeout_s: float | None = None
    floor_s: float = HANG_FLOOR_S
    factor: float = HANG_FACTOR
    warmup_steps: int = WARMUP_STEPS
    _seen: dict[int, tuple[int, int, float]] = field(default_factory=dict)  # rank -> (pid, seq, since)
    _reported: bool = False

    def force(self, now: float, ranks: Sequence[RankProgress]) -> Hang | None:
        """The hang now, whatever the timeout (another node's launcher declared it); None when
        every rank is done or it was reported already."""
        live = [r for r in ranks if r.phase != "done" and r.rank in self._seen]
        if not live or self._reported:
            return None
        self._reported = True
        return Hang(now - max(self._seen[r.rank][2] for r in live), self.timeout(live), list(live))

    def rearm(self) -> None:
        """Take back the report just made (the caller found its view incomplete)."""
        self._reported = False

    @property
    def reported(self) -> bool:
        """A hang was reported and no rank progressed since."""
        return self._reported

    def timeout(self, ranks: Sequence[RankProgress]) -> float:
        if self.timeout_s is not None:
            return self.timeout_s
        timeout = self.floor_s
        warm = [r for r in ranks if r.steps_timed >= self.warmup_steps]
        if warm and len(warm) == len(ranks):
            timeout = max(timeout, self.factor * statistics.median(r.step_s for r in warm))
        if ranks and all(r.phase in SLOW_PHASES for r in ranks):
            timeout *= SLOW_FACTOR
        return timeout

    def observe(self, now: float, ranks: Sequence[RankProgress]) -> Hang | None:
        """The hang, the first time the job is seen stalled past the timeout; None otherwise (and
        again None while the same hang lasts: a new report needs progress in between)."""
        live = [r for r in ranks if r.phase != "done"]
        progressed = False
        for r in live:
            seen = self._seen.get(r.rank)
            if seen is None or seen[:2] != (r.pid, r.seq):
                self._seen[r.rank] = (r.pid, r.seq, now)
                progressed = True
        if progressed:
            self._reported = False
        if not live or self._reported:
            return None
        stalled = now - max(self._seen[r.rank][2] for r in live)
        timeout = self.timeout(live)
        if stalled < timeout:
            return None
        self._reported = True
        return Hang(stalled, timeout, list(live))


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>.+?)\s*$')
_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+")
_LIBRARY_DIRS = tuple(
    {
        sysconfig.get_paths()[key]
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if key in sysconfig.get_paths()
    }
)


def parse_stacks(text: str) -> list[list[tuple[str, int, str]]]:
    """Threads of one faulthandler dump, each a list of ``(file, line, function)``, innermost first."""
    threads: list[list[tuple[str, int, str]]] = []
    for line in text.splitlines():
        if _THREAD.match(line):
            threads.append([])
        elif (match := _FRAME.match(line)) and threads:
            threads[-1].append((match["file"], int(match["line"]), match["func"]))
    return threads


def _is_own(path: str) -> bool:
    """The user's code or shoal's: not torch, not the standard library, not another package."""
    if f"{os.sep}shoal{os.sep}" in path:
        return True
    return not (path.startswith(_LIBRARY_DIRS) or "site-packages" in path or path.startswith("<"))


def where(text: str) -> str:
    """``train.py:88 in load_batch``: the innermost frame of the user's or shoal's code on the main
    thread (the one running ``<module>`` at its bottom, else the first dumped), or "" when unknown."""
    threads = [t for t in parse_stacks(text) if t]
    if not threads:
        return ""
    main = next((t for t in threads if t[-1][2] == "<module>"), threads[0])
    for path, line, func in main:
        if _is_own(path):
            return f"{Path(path).name}:{line} in {func}"
    path, line, func = main[0]
    return f"{Path(path).name}:{line} in {func}"


def activity(r: RankProgress) -> str:
    """The rank's phase as the report and ``shoal status`` name it: ``collective #N`` for a collective."""
    if r.phase == "collective":
        return f"collective #{r.collectives}"
    return r.phase


def hang_report(hang: Hang, stacks: dict[int, str], saved_in: str | os.PathLike | None = None) -> str:
    """A few lines: who is where. The odd ranks out (whose phase or step differs from the largest
    group's) are named one by one with their node and source line; the others as one group."""
    groups: dict[tuple[str, int], list[RankProgress]] = {}
    for r in hang.ranks:
        groups.setdefault((activity(r), r.step), []).append(r)
    # The largest group is the norm; on a tie, the ranks waiting in a collective (waiting for the
    # odd one out) are.
    ordered = sorted(groups.values(), key=lambda g: (-len(g), g[0].phase != "collective", g[0].rank))
    majority, odd = ordered[0], [r for g in ordered[1:] for r in g]
    lines = [f"shoal: no rank made progress for {hang.stalled_s:.0f} s (hang timeout {hang.timeout_s:.0f} s)"]

    def at(r: RankProgress) -> str:
        # A rank of another node: the ``where`` its own launcher shared after dumping its stack.
        place = where(stacks[r.rank]) if r.rank in stacks else r.where
        return f" at {place}" if place else ""

    parts = []
    for r in sorted(odd, key=lambda r: r.rank):
        parts.append(f"rank {r.rank} (node {r.host}) is in {activity(r)} at step {r.step}{at(r)}")
    ranks = [r.rank for r in majority]
    waiting = majority[0].phase == "collective"
    if len(ranks) == 1:
        who = f"rank {ranks[0]} {'waits' if waiting else 'is'} in"
    else:
        who = f"ranks {format_ranks(ranks)} {'wait' if waiting else 'are'} in"
    # The group's place: the first of its ranks whose place is known (a remote one may not be).
    shown = next((r for r in majority if at(r)), majority[0])
    parts.append(f"{who} {activity(majority[0])} at step {majority[0].step}{at(shown)}")
    lines.append("; ".join(parts))
    if saved_in is not None:
        lines.append(f"full stacks: {saved_in}")
    return "\n".join(lines)


@dataclass
class StragglerJudge:
    """A rank straggles when its mean compute time per step, over a window, exceeds ``margin`` x the
    median of the other ranks' for ``persistence`` windows in a row (so a blip is not named)."""

    margin: float = 1.3
    persistence: int = 3
    _streak: dict[int, int] = field(default_factory=dict)

    def window(self, compute_per_step: dict[int, float]) -> list[int]:
        """Feed one window's per-rank mean compute times; returns the ranks judged stragglers now."""
        slow = set()
        if len(compute_per_step) >= 2:
            for rank, mean in compute_per_step.items():
                others = statistics.median(v for r, v in compute_per_step.items() if r != rank)
                if others > 0 and mean > self.margin * others:
                    slow.add(rank)
        for rank in compute_per_step:
            self._streak[rank] = self._streak.get(rank, 0) + 1 if rank in slow else 0
        return sorted(r for r in slow if self._streak[r] >= self.persistence)


@dataclass(frozen=True)
class Straggler:
    """A rank :class:`StragglerWindows` names: its mean compute per step (``mean``, seconds) over its
    ``steps`` steps of the latest window over the margin, against the median of the other ranks'."""

    rank: int
    host: str
    mean: float
    others: float
    steps: int

    @property
    def ratio(self) -> float:
        return self.mean / self.others


@dataclass
class StragglerWindows:
    """:class:`StragglerJudge` over successive snapshots of the records, one :meth:`window` call per
    window. A rank's mean compute per step in a window comes from the deltas of its running totals
    (nothing lost between polls; a restarted rank's totals begin again). A rank named stays in
    :attr:`named` until ``persistence`` windows in a row at the others' pace (it leaves as it entered:
    a blip does neither); a window in which no rank stepped (a hang, a restart) changes nothing."""

    judge: StragglerJudge = field(default_factory=StragglerJudge)
    named: dict[int, Straggler] = field(default_factory=dict)
    """The stragglers now, each with the figures of its latest window over the margin."""
    starts: dict[int, tuple[int, float]] = field(default_factory=dict)
    """rank -> its (timed steps, compute seconds) totals when the current window began."""
    _calm: dict[int, int] = field(default_factory=dict)  # a named rank's windows in a row at the others' pace

    def window(self, ranks: Sequence[RankProgress]) -> tuple[list[Straggler], list[int]]:
        """The window ends with these records: ``(named, left)``, the ranks named anew in it (each the
        start of an episode) and those that left the named ones."""
        compute: dict[int, float] = {}
        steps: dict[int, int] = {}
        for r in ranks:
            begun, total = self.starts.get(r.rank, (0, 0.0))
            if r.steps_timed < begun:  # a restarted worker: its totals began again
                begun, total = 0, 0.0
            if r.steps_timed > begun:
                steps[r.rank] = r.steps_timed - begun
                compute[r.rank] = (r.total_compute_s - total) / steps[r.rank]
            self.starts[r.rank] = (r.steps_timed, r.total_compute_s)
        if not compute:
            return [], []
        hosts = {r.rank: r.host for r in ranks}
        slow = self.judge.window(compute)
        entered = []
        for rank in slow:
            others = statistics.median(v for r, v in compute.items() if r != rank)
            straggler = Straggler(rank, hosts.get(rank, "?"), compute[rank], others, steps[rank])
            if rank not in self.named:
                entered.append(straggler)
            self.named[rank], self._calm[rank] = straggler, 0
        left = []
        for rank in [r for r in self.named if r not in slow]:
            self._calm[rank] += 1 if rank in compute else 0
            if self._calm[rank] >= self.judge.persistence:
                del self.named[rank]
                left.append(rank)
        return entered, left

    def forget(self, rank: int) -> None:
        """``rank``'s process is gone: its next one starts without a past (nor a verdict)."""
        for known in (self.named, self.starts, self._calm, self.judge._streak):
            known.pop(rank, None)


def straggler_line(rank: int, host: str, mean: float, others: float) -> str:
    """The one line naming a straggler: its ``mean`` compute per step against the ``others``' median."""
    return (
        f"shoal: rank {rank} (node {host}) straggles: {mean * 1e3:.1f} ms of compute per step "
        f"vs {others * 1e3:.1f} ms for the others ({mean / others:.2f}x)"
    )
