"""The watch that runs in the launcher, beside torch's agent:

- :class:`JobWatch`, one launch's watch, which the launch core runs: the progress directory, a
  :class:`Monitor` over it, the workers' process trees remembered, and ``--on-hang`` acted on (report,
  stop, restart); nothing the workers started outlives the launcher;
- :class:`Monitor`, the thread polling the progress channel every second: on a hang it saves the
  stacks under ``RUN_DIR/hang-<time>/`` and calls ``on_hang`` (with a :class:`HangEvent`); every window
  it judges stragglers; given ``publish``/``peers`` (the rendezvous store's set/get, from the launch
  core) it shares its node's records with the other launchers every ``share_s`` and judges the whole
  job."""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from shoal.launch.watchdog.judges import (
    Hang,
    HangDetector,
    StragglerJudge,
    StragglerWindows,
    activity,
    hang_report,
    straggler_line,
    where,
)
from shoal.launch.watchdog.options import STOP_GRACE_S, WATCHDOG_ENV, straggler_window_s
from shoal.launch.watchdog.processes import (
    alive,
    children,
    descendants,
    dump_all_stacks,
    is_helper,
    started_at,
    stop_processes,
)
from shoal.progress import (
    VERDICT_FILE,
    RankProgress,
    from_summary,
    read_progress,
    run_progress_dir,
    to_summary,
    write_verdict,
)

_STOP_WAIT_S = 5.0
"""The longest :meth:`Monitor.stop` waits for its thread (a poll takes well under a second)."""


@dataclass
class HangEvent:
    """What :class:`Monitor` hands ``on_hang``: the report's text and where the stacks lie."""

    report: str
    directory: Path
    hang: Hang


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
        self._windows = StragglerWindows(self.judge)  # the stragglers of the verdict now: its ``named``
        self._hang_line: str | None = None
        self._where: dict[int, str] = {}  # this node's ranks, from the stacks of the current hang
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shoal-watchdog", daemon=True)
        self._window_start = self._windows.starts
        self._window_at = 0.0
        self.publish, self.peers, self.share_s = publish, peers, share_s
        self.peer_wait_s = 2 * share_s + 2 if peer_wait_s is None else peer_wait_s
        self._shared_at = -float("inf")
        self._remote: list[RankProgress] = []
        self._share_failed = False
        self.idle = threading.Event()
        """Clear while a hang is being reported and acted on (from its declaration until ``on_hang``
        returned): the launch core waits for it before it tells why the workers ended."""
        self.idle.set()

    def start(self) -> Monitor:
        self._window_at = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling. Waits at most :data:`_STOP_WAIT_S` for the thread: one blocked in a call to
        a vanished node's store (which lasts the store's timeout, up to the join timeout) is left
        behind, a daemon, rather than holding the launcher's exit after SIGTERM."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(_STOP_WAIT_S)

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
        self.idle.clear()
        try:
            event = self._report(hang)
            self.events.append(event)
            lines = event.report.splitlines()
            self._hang_line = lines[1] if len(lines) > 1 else lines[0]
            self._write_verdict()
            if self.on_hang is not None:
                self.on_hang(event)
        finally:
            self.idle.set()
        return event

    def _share(self, local: list[RankProgress] | None) -> bool:
        """Publish this node's records (with each rank's ``where`` during a hang; nothing when
        ``local`` is None) and fetch the other nodes'; a failure keeps the last ones, said once.
        False when the store could not be reached."""
        try:
            if self.publish is not None and local is not None:
                self.publish(to_summary([dataclasses.replace(r, where=self._where.get(r.rank, "")) for r in local]))
            if self.peers is not None:
                self._remote = [r for data in self.peers() for r in from_summary(data)]
            return True
        except Exception as err:
            if not self._share_failed:
                print(f"shoal: watchdog: cannot share progress with the other nodes: {err}", file=sys.stderr)
            self._share_failed = True
            return False

    def _report(self, hang: Hang) -> HangEvent:
        directory = self.run_dir / f"hang-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
        directory.mkdir(parents=True, exist_ok=True)
        stacks = dump_all_stacks([r for r in hang.ranks if not r.remote and r.alive])
        self._where = {rank: where(text) for rank, text in stacks.items()}
        for r in hang.ranks:
            if r.remote:
                continue  # its own launcher dumps it, under its run directory
            text = stacks.get(r.rank) or "(no stack: the rank did not register the stacks signal, or is gone)\n"
            head = f"rank {r.rank} pid {r.pid} node {r.host} step {r.step} phase {activity(r)}\n\n"
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
        hang within a share period) dumped and published them; at most ``peer_wait_s``, and no
        longer once the store is gone (the node hosting it acted on the hang and left)."""
        deadline = time.monotonic() + self.peer_wait_s
        while True:
            reached = self._share(None)  # fetch only
            latest = {r.rank: r for r in self._remote if r.where}
            ranks = [
                dataclasses.replace(r, where=latest[r.rank].where) if r.remote and r.rank in latest else r
                for r in hang.ranks
            ]
            hang = dataclasses.replace(hang, ranks=ranks)
            done = all(r.where for r in ranks if r.remote)
            if done or not reached or time.monotonic() >= deadline or self._stop.is_set():
                return hang
            time.sleep(0.5)

    def _judge(self, ranks: Sequence[RankProgress]) -> None:
        before = set(self._windows.named)
        named, _ = self._windows.window(ranks)
        for straggler in named:
            if straggler.rank not in self.stragglers:  # each rank's line once
                self.stragglers.add(straggler.rank)
                line = straggler_line(straggler.rank, straggler.host, straggler.mean, straggler.others)
                if self.on_straggler is not None:
                    self.on_straggler(line)
                else:
                    print(line, file=sys.stderr, flush=True)
        if set(self._windows.named) != before:
            self._write_verdict()

    def _write_verdict(self) -> None:
        if self.verdict_path is None:
            return
        try:
            named = [self._windows.named[r] for r in sorted(self._windows.named)]
            stragglers = [
                {
                    "rank": s.rank,
                    "node": s.host,
                    "ratio": round(s.ratio, 2),
                    "line": straggler_line(s.rank, s.host, s.mean, s.others),
                }
                for s in named
            ]
            write_verdict(self.verdict_path, stragglers, self._hang_line)
        except OSError as err:
            print(f"shoal: watchdog: cannot write {self.verdict_path}: {err}", file=sys.stderr, flush=True)


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
        self.progress_dir = run_progress_dir(self.run_dir)
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
            window_s = straggler_window_s()
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
        return [pid for pid in children(self._launcher) if pid not in self._before and not is_helper(pid)]

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
        return sorted(pid for pid, start in self._known.items() if alive(pid) and started_at(pid) == start)

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

    def settle(self) -> None:
        """Wait until a hang the monitor is reporting has been acted on (at most the wait for the
        other nodes' stacks and this node's stop), so that the workers' end is told as that hang.
        Across nodes the workers may fail first: the node hosting the store acted and left."""
        self.monitor.idle.wait(self.monitor.peer_wait_s + 2 * self.grace_s + 5)

    @property
    def stopped_this_attempt(self) -> bool:
        """The workers of the current attempt were stopped for a hang (their failure is the hang's)."""
        return self.event is not None and self.event_attempt == self.attempts

    def close(self, grace_s: float = 2.0) -> list[int]:
        """Stop the monitor, then any worker still running (torch's agent stopped them already, or
        tried: a rank blocked in a collective ignores SIGTERM). Returns the PIDs that needed SIGKILL."""
        self.monitor.stop()
        return stop_processes(self._remaining(), grace_s)
