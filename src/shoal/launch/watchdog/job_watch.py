"""One launch's watch (:class:`JobWatch`): the progress directory, a :class:`Monitor` over it, the
workers' process trees remembered, and ``--on-hang`` acted on (report, stop, restart); nothing the
workers started outlives the launcher."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from shoal.launch.watchdog.hangs import HangDetector
from shoal.launch.watchdog.monitor import HangEvent, Monitor
from shoal.launch.watchdog.options import STOP_GRACE_S, WATCHDOG_ENV
from shoal.launch.watchdog.processes import alive, children, descendants, is_helper, started_at, stop_processes
from shoal.progress import VERDICT_FILE


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
