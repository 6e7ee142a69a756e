"""The launcher's watch over its workers' progress: hangs, stragglers, stacks, and stopping for good.

Pure parts (testable over data): :class:`HangDetector` decides from successive snapshots of the
progress channel (:mod:`shoal.progress`) that no rank made progress for the hang timeout, and
:func:`hang_report` names the odd rank(s) out with the source line from their stacks;
:class:`StragglerJudge` names a rank whose compute time per step stays above the others' by a margin
for several windows in a row.

With processes: :func:`dump_stacks` has a rank's faulthandler write every thread's stack (works
while the rank is blocked in a collective); :func:`stop_processes` sends SIGTERM, then SIGKILL after
the grace (a rank blocked in a gloo collective runs no Python signal handler, so SIGTERM alone may
never stop it); :class:`Monitor` is the thread that polls the channel every second beside torch's
agent and, on a hang, saves the stacks under ``RUN_DIR/hang-<time>/`` and calls ``on_hang``; given
``publish``/``peers`` (the rendezvous store's set/get, from the launch core) it shares its node's
records with the other launchers every ``share_s`` and judges the whole job.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import statistics
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from shoal.errors import ShoalError
from shoal.progress import RankProgress, from_summary, read_progress, to_summary

HANG_FLOOR_S = 30.0
"""The shortest hang timeout. With a 1 s poll and a stack dump of about a second, a hang is reported
well within 60 s of its start. Long enough for a slow step of a small job; a job whose steps take
longer gets ``HANG_FACTOR`` times its step time."""
HANG_FACTOR = 10.0
WARMUP_STEPS = 3
"""Steps before the observed step time counts (the first ones include compiling, caches, loaders)."""
SLOW_PHASES = frozenset({"start", "checkpoint", "evaluation"})
"""Phases that may legitimately take much longer than a step: when every rank is in one of them the
timeout is ``SLOW_FACTOR`` times longer."""
SLOW_FACTOR = 4.0
STOP_GRACE_S = 5.0
"""``--on-hang stop|restart``: how long a hung rank gets after SIGTERM before SIGKILL (a rank blocked in
a collective runs no Python handler; one that does, such as the preemption handler, gets to exit)."""
HANG_EXIT_CODE = 124
"""``--on-hang stop``: the launcher's exit status (as GNU ``timeout``'s when the command timed out)."""
WATCHDOG_ENV = "SHOAL_WATCHDOG"
"""``SHOAL_WATCHDOG=0`` in the launcher's environment turns the watchdog off (for an A/B measurement)."""
VERDICT_FILE = "verdict.json"
"""The monitor's verdict in the progress directory, rewritten (tmp + rename) whenever it changes:
``{"time": unix s, "stragglers": [{"rank", "node", "ratio", "line"}], "hang": null or {"line"}}``.
The trainer reads it at each epoch (stragglers in metrics.jsonl)."""


ON_HANG = ("report", "stop", "restart")
"""What ``--on-hang`` may say: only report; stop the workers (:func:`stop_processes`) and fail; stop
them and let the agent's restart policy start the next attempt."""


def hang_options(hang_timeout: str | float | None, on_hang: str = "report") -> tuple[float | None, str]:
    """``--hang-timeout`` and ``--on-hang`` checked: ``(seconds or None for the derived default,
    action)``. Bad values raise :class:`ShoalError` with a hint."""
    timeout = None
    if hang_timeout not in (None, ""):
        try:
            timeout = float(hang_timeout)
        except (TypeError, ValueError):
            timeout = -1.0
        if not timeout > 0 or timeout != timeout or timeout == float("inf"):
            raise ShoalError(
                f"--hang-timeout {hang_timeout!r} is not a positive number of seconds",
                f"give seconds, e.g. --hang-timeout 120, or leave it out for max({HANG_FLOOR_S:.0f} s, "
                f"{HANG_FACTOR:.0f} x the step time)",
            )
    if on_hang not in ON_HANG:
        raise ShoalError(
            f"--on-hang {on_hang!r} is not one of {', '.join(ON_HANG)}", "use --on-hang report|stop|restart"
        )
    return timeout, on_hang


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


# -- hangs -----------------------------------------------------------------------------------------


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


def _activity(r: RankProgress) -> str:
    if r.phase == "collective":
        return f"collective #{r.collectives}"
    return r.phase


def hang_report(hang: Hang, stacks: dict[int, str], saved_in: str | os.PathLike | None = None) -> str:
    """A few lines: who is where. The odd ranks out (whose phase or step differs from the largest
    group's) are named one by one with their node and source line; the others as one group."""
    groups: dict[tuple[str, int], list[RankProgress]] = {}
    for r in hang.ranks:
        groups.setdefault((_activity(r), r.step), []).append(r)
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
        parts.append(f"rank {r.rank} (node {r.host}) is in {_activity(r)} at step {r.step}{at(r)}")
    ranks = [r.rank for r in majority]
    waiting = majority[0].phase == "collective"
    if len(ranks) == 1:
        who = f"rank {ranks[0]} {'waits' if waiting else 'is'} in"
    else:
        who = f"ranks {format_ranks(ranks)} {'wait' if waiting else 'are'} in"
    # The group's place: the first of its ranks whose place is known (a remote one may not be).
    shown = next((r for r in majority if at(r)), majority[0])
    parts.append(f"{who} {_activity(majority[0])} at step {majority[0].step}{at(shown)}")
    lines.append("; ".join(parts))
    if saved_in is not None:
        lines.append(f"full stacks: {saved_in}")
    return "\n".join(lines)


# -- stragglers ------------------------------------------------------------------------------------


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


def straggler_line(rank: int, ranks: Sequence[RankProgress], compute: dict[int, float]) -> str:
    others = statistics.median(v for r, v in compute.items() if r != rank)
    host = next((r.host for r in ranks if r.rank == rank), "?")
    return (
        f"shoal: rank {rank} (node {host}) straggles: {compute[rank] * 1e3:.1f} ms of compute per step "
        f"vs {others * 1e3:.1f} ms for the others ({compute[rank] / others:.2f}x)"
    )


# -- processes -------------------------------------------------------------------------------------


def dump_stacks(record: RankProgress, timeout_s: float = 5.0) -> str:
    """Every thread's stack of the rank behind ``record``, as faulthandler writes it; "" when the rank
    did not register the signal, is gone, or wrote nothing within ``timeout_s``."""
    return dump_all_stacks([record], timeout_s).get(record.rank, "")


def dump_all_stacks(records: Sequence[RankProgress], timeout_s: float = 5.0) -> dict[int, str]:
    """:func:`dump_stacks` for many ranks at once: every signal is sent first, then the dumps are
    collected, so eight ranks take as long as one."""
    started: dict[int, tuple[Path, int]] = {}
    for record in records:
        if not record.stacks_signal:
            continue  # its default action would terminate the rank
        path = record.stacks_file
        start = path.stat().st_size if path.exists() else 0
        try:
            os.kill(record.pid, record.stacks_signal)
        except (ProcessLookupError, PermissionError):
            continue
        started[record.rank] = (path, start)
    sizes = {rank: (start, time.monotonic()) for rank, (_, start) in started.items()}
    deadline = time.monotonic() + timeout_s
    pending = set(started)
    while pending and time.monotonic() < deadline:
        time.sleep(0.02)
        for rank in list(pending):
            path, start = started[rank]
            size = path.stat().st_size if path.exists() else 0
            if size != sizes[rank][0]:
                sizes[rank] = (size, time.monotonic())
            elif size > start and time.monotonic() - sizes[rank][1] > 0.1:
                pending.discard(rank)  # written in one go from the handler: quiet for 100 ms is done
    stacks = {}
    for rank, (path, start) in started.items():
        with open(path, "rb") as f:
            f.seek(start)
            stacks[rank] = f.read(sizes[rank][0] - start).decode(errors="replace")
    return stacks


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent, the agent) is gone; reaping is the parent's.
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


def stop_processes(pids: Iterable[int], grace_s: float = 10.0) -> list[int]:
    """SIGTERM to each of ``pids``; SIGKILL to those still there after ``grace_s``; wait until all are
    gone. Returns the PIDs that needed SIGKILL (for example a rank blocked in a collective)."""
    pids = [pid for pid in pids if _alive(pid)]
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.05)
    killed = [pid for pid in pids if _alive(pid)]
    for pid in killed:
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and any(_alive(pid) for pid in killed):
        time.sleep(0.02)
    return killed


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (Linux; [] elsewhere), from ``/proc/PID/task/*/children``."""
    found: list[int] = []
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(child) for child in path.read_text().split()]
        except (OSError, ValueError):
            continue
    return sorted(set(found))


def descendants(pids: Iterable[int]) -> list[int]:
    """``pids``' children, their children, and so on (not ``pids`` themselves)."""
    found: list[int] = []
    todo = list(pids)
    while todo:
        kids = children(todo.pop())
        found += kids
        todo += kids
    return found


def started_at(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), to tell it from a later one with its PID."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _helper(pid: int) -> bool:
    """A multiprocessing helper (resource tracker, fork server) rather than a worker."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"multiprocessing" in cmdline and (b"resource_tracker" in cmdline or b"forkserver" in cmdline)


# -- the monitor -----------------------------------------------------------------------------------


@dataclass
class HangEvent:
    """What :class:`Monitor` hands ``on_hang``: the report's text and where the stacks lie."""

    report: str
    directory: Path
    hang: Hang


def write_verdict(path: str | os.PathLike, stragglers: Sequence[dict], hang_line: str | None) -> None:
    """:data:`VERDICT_FILE`'s content, written atomically (a reader sees the old or the new one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "time": time.time(),
        "stragglers": list(stragglers),
        "hang": None if hang_line is None else {"line": hang_line},
    }
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    temporary.write_text(json.dumps(data) + "\n")
    os.replace(temporary, path)


class Monitor:
    """A daemon thread polling ``progress_dir`` every ``interval_s``: on a hang it dumps every live
    rank's stack into ``run_dir/hang-<UTC time>/rank-N.txt``, writes ``report.txt`` there, prints the
    report to stderr and calls ``on_hang(event)`` (the caller decides: report, stop or restart).
    Every ``window_s`` it judges stragglers from the ranks' running totals and prints one line per
    newly named straggler (``on_straggler(line)`` instead when given). With ``verdict_path`` it
    rewrites that file (:data:`VERDICT_FILE`) whenever the straggler or hang verdict changes.

    Several nodes: ``publish(data)`` / ``peers()`` share the records every ``share_s``. On a hang each
    node's monitor dumps its own ranks' stacks and publishes a short ``where`` per rank at once; a
    report naming ranks of other nodes waits up to ``peer_wait_s`` for theirs."""

    def __init__(
        self,
        progress_dir: str | os.PathLike,
        run_dir: str | os.PathLike,
        *,
        detector: HangDetector | None = None,
        judge: StragglerJudge | None = None,
        on_hang: Callable[[HangEvent], None] | None = None,
        on_straggler: Callable[[str], None] | None = None,
        interval_s: float = 1.0,
        window_s: float = 10.0,
        publish: Callable[[bytes], None] | None = None,
        peers: Callable[[], list[bytes]] | None = None,
        share_s: float = 5.0,
        verdict_path: str | os.PathLike | None = None,
        peer_wait_s: float | None = None,
        on_poll: Callable[[], None] | None = None,
    ) -> None:
        self.on_poll = on_poll
        self.progress_dir = Path(progress_dir)
        self.run_dir = Path(run_dir)
        self.detector = detector or HangDetector()
        self.judge = judge or StragglerJudge()
        self.on_hang = on_hang
        self.on_straggler = on_straggler
        self.interval_s = interval_s
        self.window_s = window_s
        self.events: list[HangEvent] = []
        self.stragglers: set[int] = set()
        """Every rank named a straggler so far (each line is printed once)."""
        self.verdict_path = Path(verdict_path) if verdict_path is not None else None
        self._current: dict[int, dict] = {}  # the stragglers of the verdict now
        self._calm: dict[int, int] = {}  # a named straggler's windows in a row at the others' pace
        self._hang_line: str | None = None
        self._where: dict[int, str] = {}  # this node's ranks, from the stacks of the current hang
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shoal-watchdog", daemon=True)
        self._window_start: dict[int, tuple[int, float]] = {}
        self._window_at = 0.0
        self.publish, self.peers, self.share_s = publish, peers, share_s
        self.peer_wait_s = 2 * share_s + 2 if peer_wait_s is None else peer_wait_s
        self._shared_at = -float("inf")
        self._remote: list[RankProgress] = []
        self._share_failed = False

    def start(self) -> Monitor:
        self._window_at = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll()
            except Exception as err:  # the watchdog never takes the job down
                print(f"shoal: watchdog: {type(err).__name__}: {err}", file=sys.stderr, flush=True)

    def poll(self, now: float | None = None) -> HangEvent | None:
        """One look at the channel (the thread calls this every ``interval_s``)."""
        now = time.monotonic() if now is None else now
        if self.on_poll is not None:
            self.on_poll()
        ranks = read_progress(self.progress_dir)
        if now - self._shared_at >= self.share_s:
            self._shared_at = now
            self._share(ranks)
        own = {r.rank for r in ranks}
        ranks += [r for r in self._remote if r.rank not in own]
        hang = self.detector.observe(now, ranks)
        # Not every node's ranks seen yet (their summary comes every share_s): a hang judged on this
        # node's alone might name the wrong rank. Wait up to two share periods more.
        if (
            hang is not None
            and self.peers is not None
            and len(ranks) < max(r.world_size for r in ranks)
            and hang.stalled_s < hang.timeout_s + 2 * self.share_s
        ):
            self.detector.rearm()
            self._shared_at = -float("inf")  # fetch at the next poll
            hang = None
        if hang is None and not self.detector.reported and any(r.where for r in self._remote):
            # Another node's launcher declared the hang (it shares where its ranks are): dump and
            # report this node's ranks now, so that every node saves its stacks and acts together.
            hang = self.detector.force(now, ranks)
        if not self.detector.reported and (self._hang_line is not None or self._where):
            self._hang_line, self._where = None, {}  # progress again: the hang is over
            self._write_verdict()
        if now - self._window_at >= self.window_s:
            self._judge(ranks)
            self._window_at = now
        if hang is None:
            return None
        event = self._report(hang)
        self.events.append(event)
        lines = event.report.splitlines()
        self._hang_line = lines[1] if len(lines) > 1 else lines[0]
        self._write_verdict()
        if self.on_hang is not None:
            self.on_hang(event)
        return event

    def _share(self, local: list[RankProgress] | None) -> None:
        """Publish this node's records (with each rank's ``where`` during a hang; nothing when
        ``local`` is None) and fetch the other nodes'; a failure keeps the last ones, said once."""
        try:
            if self.publish is not None and local is not None:
                self.publish(to_summary([dataclasses.replace(r, where=self._where.get(r.rank, "")) for r in local]))
            if self.peers is not None:
                self._remote = [r for data in self.peers() for r in from_summary(data)]
        except Exception as err:
            if not self._share_failed:
                print(f"shoal: watchdog: cannot share progress with the other nodes: {err}", file=sys.stderr)
            self._share_failed = True

    def _report(self, hang: Hang) -> HangEvent:
        directory = self.run_dir / f"hang-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
        directory.mkdir(parents=True, exist_ok=True)
        stacks = dump_all_stacks([r for r in hang.ranks if not r.remote and r.alive])
        self._where = {rank: where(text) for rank, text in stacks.items()}
        for r in hang.ranks:
            if r.remote:
                continue  # its own launcher dumps it, under its run directory
            text = stacks.get(r.rank) or "(no stack: the rank did not register the stacks signal, or is gone)\n"
            head = f"rank {r.rank} pid {r.pid} node {r.host} step {r.step} phase {_activity(r)}\n\n"
            (directory / f"rank-{r.rank}.txt").write_text(head + text)
        if any(r.remote for r in hang.ranks):
            self._share(read_progress(self.progress_dir))  # where this node's ranks are, for the others
            hang = self._remote_places(hang)
        report = hang_report(hang, stacks, saved_in=directory)
        (directory / "report.txt").write_text(report + "\n")
        print(report, file=sys.stderr, flush=True)
        return HangEvent(report, directory, hang)

    def _remote_places(self, hang: Hang) -> Hang:
        """The hang with the other nodes' ranks' ``where``, once their launchers (which see the same
        hang within a share period) dumped and published them; at most ``peer_wait_s``."""
        deadline = time.monotonic() + self.peer_wait_s
        while True:
            self._share(None)  # fetch only
            latest = {r.rank: r for r in self._remote if r.where}
            ranks = [
                dataclasses.replace(r, where=latest[r.rank].where) if r.remote and r.rank in latest else r
                for r in hang.ranks
            ]
            hang = dataclasses.replace(hang, ranks=ranks)
            if all(r.where for r in ranks if r.remote) or time.monotonic() >= deadline or self._stop.is_set():
                return hang
            time.sleep(0.5)

    def _judge(self, ranks: Sequence[RankProgress]) -> None:
        compute: dict[int, float] = {}
        for r in ranks:
            steps, total = self._window_start.get(r.rank, (0, 0.0))
            if r.steps_timed < steps:  # a restarted worker: its totals began again
                steps, total = 0, 0.0
            if r.steps_timed > steps:
                compute[r.rank] = (r.total_compute_s - total) / (r.steps_timed - steps)
            self._window_start[r.rank] = (r.steps_timed, r.total_compute_s)
        if not compute:
            return  # no step in this window (a hang, a restart): the verdict stands
        slow = self.judge.window(compute)
        current = {}
        for rank in slow:
            line = straggler_line(rank, ranks, compute)
            others = statistics.median(v for r, v in compute.items() if r != rank)
            host = next((r.host for r in ranks if r.rank == rank), "?")
            current[rank] = {"rank": rank, "node": host, "ratio": round(compute[rank] / others, 2), "line": line}
            self._calm[rank] = 0
            if rank not in self.stragglers:
                self.stragglers.add(rank)
                if self.on_straggler is not None:
                    self.on_straggler(line)
                else:
                    print(line, file=sys.stderr, flush=True)
        # A named straggler leaves the verdict as it entered it: after ``persistence`` windows in a
        # row at the others' pace (one quick window is a blip too).
        for rank, entry in self._current.items():
            if rank in current:
                continue
            self._calm[rank] = self._calm.get(rank, 0) + (1 if rank in compute else 0)
            if self._calm[rank] < self.judge.persistence:
                current[rank] = entry
        changed = set(current) != set(self._current)
        self._current = current
        if changed:
            self._write_verdict()

    def _write_verdict(self) -> None:
        if self.verdict_path is None:
            return
        try:
            write_verdict(self.verdict_path, [self._current[r] for r in sorted(self._current)], self._hang_line)
        except OSError as err:
            print(f"shoal: watchdog: cannot write {self.verdict_path}: {err}", file=sys.stderr, flush=True)


# -- one launch's watch ----------------------------------------------------------------------------


class JobWatch:
    """What the launch core runs beside torch's agent: the progress directory ``RUN_DIR/progress``
    (cleared at each attempt of the workers), a :class:`Monitor` over it, and ``--on-hang``.

    ``report``: the monitor's report only. ``stop``: ``on_stop()`` first (the launch core keeps the
    agent from restarting), then :func:`stop_processes` on this node's workers; :attr:`stopping`
    tells the launch core to fail with the report. ``restart``: the same stop, and torch's agent
    starts the next attempt (counted against ``--max-restarts``). :meth:`close` stops the monitor and
    any worker still there (SIGTERM, SIGKILL after the grace): nothing outlives the launcher.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        hang_timeout: float | None = None,
        on_hang: str = "report",
        grace_s: float = STOP_GRACE_S,
        on_stop: Callable[[], None] | None = None,
        publish: Callable[[bytes], None] | None = None,
        peers: Callable[[], list[bytes]] | None = None,
        window_s: float | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.progress_dir = self.run_dir / "progress"
        self.enabled = os.environ.get(WATCHDOG_ENV, "1").strip().lower() not in ("0", "off", "false", "no")
        """False with ``SHOAL_WATCHDOG=0``: no progress directory for the workers, no monitor (the
        workers are still stopped for good when the launcher returns)."""
        self.action = on_hang
        self.grace_s = grace_s
        self.on_stop = on_stop
        self.event: HangEvent | None = None
        """The hang that made this launcher stop its workers (``stop`` and ``restart``)."""
        self.stopping = False
        """``--on-hang stop`` acted: the launch fails with the report."""
        self.attempts = 0
        """Starts of the workers so far (:meth:`new_attempt`)."""
        self.event_attempt = -1
        """The attempt whose workers this watch stopped for a hang."""
        self._launcher = os.getpid()
        self._before = set(children(self._launcher))
        self._known: dict[int, int | None] = {}  # pid -> start time: workers and their descendants
        if window_s is None:
            window_s = float(os.environ.get("SHOAL_STRAGGLER_WINDOW_S") or 10.0)
        # Share often enough that the other nodes' records are fresh well within the timeout.
        share_s = 5.0 if hang_timeout is None else max(0.5, min(5.0, hang_timeout / 4))
        self.monitor = Monitor(
            self.progress_dir, self.run_dir, detector=HangDetector(timeout_s=hang_timeout), on_hang=self._on_hang,
            window_s=window_s, publish=publish, peers=peers, share_s=share_s,
            verdict_path=self.progress_dir / VERDICT_FILE, on_poll=self.track,
        )  # fmt: skip

    def start(self) -> JobWatch:
        if not self.enabled:
            return self
        self.progress_dir.mkdir(parents=True, exist_ok=True)
        self.new_attempt()
        self.monitor.start()
        return self

    def new_attempt(self) -> None:
        """Before the workers (re)start: the previous attempt's records, stacks and verdict go."""
        self.attempts += 1
        if not self.enabled:
            return
        for pattern in ("rank-*.progress", "rank-*.progress.tmp-*", "rank-*.stacks", VERDICT_FILE):
            for path in self.progress_dir.glob(pattern):
                path.unlink(missing_ok=True)

    def worker_pids(self) -> list[int]:
        """This launcher's children started since the watch began (the agent's workers), helpers of
        multiprocessing left out."""
        return [pid for pid in children(self._launcher) if pid not in self._before and not _helper(pid)]

    def track(self) -> list[int]:
        """The workers and every process they started (a DataLoader's workers...), remembered (each
        second, by the monitor): a loader worker blocked in ``__getitem__`` never notices that its
        rank is gone, and its parent can no longer be asked for it once stopped."""
        workers = self.worker_pids()
        tree = workers + descendants(workers)
        for pid in tree:
            if pid not in self._known:
                self._known[pid] = started_at(pid)
        return tree

    def _remaining(self) -> list[int]:
        """Every process of the workers' trees ever seen that still runs (the same process: its
        start time matches), and the workers now."""
        self.track()
        return sorted(pid for pid, start in self._known.items() if _alive(pid) and started_at(pid) == start)

    def _on_hang(self, event: HangEvent) -> None:
        if self.action == "report":
            return
        self.event, self.event_attempt = event, self.attempts
        if self.action == "stop":
            self.stopping = True
            if self.on_stop is not None:
                self.on_stop()
        else:
            print(
                "shoal: --on-hang restart: stopping the workers; torch's agent starts them again "
                "(from the last checkpoint, if the job resumes)",
                file=sys.stderr,
                flush=True,
            )
        local = {r.pid for r in event.hang.ranks if not r.remote}
        stop_processes(sorted(local | set(self._remaining())), self.grace_s)

    @property
    def stopped_this_attempt(self) -> bool:
        """The workers of the current attempt were stopped for a hang (their failure is the hang's)."""
        return self.event is not None and self.event_attempt == self.attempts

    def close(self, grace_s: float = 2.0) -> list[int]:
        """Stop the monitor, then any worker still running (torch's agent stopped them already, or
        tried: a rank blocked in a collective ignores SIGTERM). Returns the PIDs that needed SIGKILL."""
        self.monitor.stop()
        return stop_processes(self._remaining(), grace_s)
