"""Run what :mod:`shoal.jobs.hosts.render` rendered: mpirun, or one launcher per host over SSH.

The processes started here write straight to this terminal. They run in sessions of their own, so
a Ctrl-C reaches shoal first, which then stops them in order: mpirun gets SIGTERM (it stops every
rank); a per-host launcher has its stdin closed, which its guard (see
:func:`shoal.jobs.hosts.render.render_ssh`) turns into SIGTERM for the remote ``shoal run``, which stops
its workers. Whatever still runs after a grace period is killed. When one host's launcher fails,
the others are stopped the same way and shoal exits with the failed one's status. A host whose
workers were stopped only because another node's failed (:data:`EXIT_ANOTHER_NODE_FAILED`) can end
first when the failing host is further away: its status is reported only if no other host fails
within :data:`SETTLE_S`. Under mpirun the same holds for ranks: each rank's exit status comes back
through :mod:`shoal.jobs.hosts.rank_status` (see :func:`supervise_mpirun`).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from shoal.errors import EXIT_ANOTHER_NODE_FAILED
from shoal.jobs.programs import require_program
from shoal.stopping import stop_with_grace

GRACE_S = 20.0
"""How long stopped launchers get to stop their workers before they are killed."""
SETTLE_S = 10.0
"""How long the hosts that only saw another node fail wait for the host with the cause to exit."""
MPIRUN_HINT = "install Open MPI (Debian/Ubuntu: apt-get install openmpi-bin), use --via ssh, or add --dry-run to print the command"
SSH_HINT = (
    "install an SSH client (Debian/Ubuntu: apt-get install openssh-client), give --rsh PROGRAM, or use --via mpirun"
)
STATUS_MARKER = "shoal-rank-status:"
"""What :mod:`.rank_status` writes before each rank's exit status. Defined here, the module that reads
it, so that ``python -m shoal.jobs.hosts.rank_status`` does not find itself already imported by the
package (runpy's RuntimeWarning on every rank)."""
_STATUS_LINE = re.compile(re.escape(STATUS_MARKER) + r" rank=(\d+) status=(\d+)")


class _Stop(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP raise :class:`_Stop` in the main thread while inside."""

    def handler(signum, _frame):
        raise _Stop(signum)

    saved = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


def supervise_mpirun(argv: Sequence[str], ranks: Sequence[str] | None = None) -> int:
    """Run an ``mpirun`` command line; return its exit status (128+N if stopped by signal N).

    ``ranks`` (the host of each rank) when ``argv`` runs every rank under
    :mod:`shoal.jobs.hosts.rank_status` with mpirun's abort on failure turned off (``render_mpirun(...,
    report_status=True)``): the ranks' status lines are taken out of mpirun's stderr, and the first
    rank that fails for a cause of its own is reported and returned, as :func:`run_launchers` does for
    hosts; ranks that only saw another fail (status 75) are reported only if no cause shows within
    :data:`SETTLE_S`. Then mpirun is stopped, which stops every rank.
    """
    require_program(argv[0], MPIRUN_HINT)
    if ranks is None:
        proc = subprocess.Popen(list(argv), start_new_session=True)
        try:
            with _signals_raise():
                return _status(proc.wait())
        except _Stop as stop:
            print(f"shoal launch: stopping mpirun ({signal.Signals(stop.signum).name})", file=sys.stderr, flush=True)
            _stop([proc], by_stdin=False)
            return 128 + stop.signum
    proc = subprocess.Popen(list(argv), stderr=subprocess.PIPE, start_new_session=True)
    statuses: dict[int, int] = {}
    reader = threading.Thread(target=_relay_stderr, args=(proc, statuses), daemon=True)
    reader.start()
    try:
        with _signals_raise():
            verdict = _FirstCause()
            while True:
                done = proc.poll() is not None
                if done:
                    reader.join(timeout=5)
                failed = [(rank, status) for rank, status in dict(statuses).items() if status != 0]
                chosen = verdict.pick(failed, still_running=not done)
                if chosen is not None:
                    rank, status, is_cause = chosen
                    host = f" on {ranks[rank]}" if rank < len(ranks) else ""
                    why = "" if is_cause else " (stopped because another rank failed; none reported a cause)"
                    rest = "; stopping the other ranks" if not done else ""
                    print(
                        f"shoal launch: rank {rank}{host} exited with status {status}{why}{rest}",
                        file=sys.stderr,
                        flush=True,
                    )
                    _stop([proc], by_stdin=False)
                    return status
                if done:
                    return _status(proc.returncode)
                time.sleep(0.1)
    except _Stop as stop:
        print(f"shoal launch: stopping mpirun ({signal.Signals(stop.signum).name})", file=sys.stderr, flush=True)
        _stop([proc], by_stdin=False)
        return 128 + stop.signum


class _FirstCause:
    """Which failure to report: the first with a cause of its own; a failure that only follows another
    node's (:data:`EXIT_ANOTHER_NODE_FAILED`) once no cause has shown within :data:`SETTLE_S` while
    others still run (the node with the cause can be further away and end later)."""

    def __init__(self) -> None:
        self.settle_until: float | None = None

    def pick(self, failed: Sequence[tuple[int, int]], *, still_running: bool) -> tuple[int, int, bool] | None:
        """(who, status, is_cause) to report now, or None to keep waiting."""
        causes = [(who, status) for who, status in failed if status != EXIT_ANOTHER_NODE_FAILED]
        if causes:
            return (*causes[0], True)
        if not failed:
            return None
        if still_running:
            self.settle_until = self.settle_until or time.monotonic() + SETTLE_S
            if time.monotonic() < self.settle_until:
                return None
        return (*failed[0], False)


def _relay_stderr(proc: subprocess.Popen, statuses: dict[int, int]) -> None:
    """Copy mpirun's stderr to ours, except the ranks' status lines, which go into ``statuses``."""
    assert proc.stderr is not None
    for raw in proc.stderr:
        line = raw.decode(errors="replace")
        match = _STATUS_LINE.search(line)
        if match is None:
            sys.stderr.write(line)
        else:
            before = line[: match.start()]
            if before.strip():
                sys.stderr.write(before.rstrip("\n") + "\n")
            statuses.setdefault(int(match.group(1)), int(match.group(2)))
        sys.stderr.flush()


def run_launchers(commands: Sequence[Sequence[str]], labels: Sequence[str]) -> int:
    """Start every command (one per host) and wait; on a failure or a signal stop the others.

    Returns 0 when all succeeded, else the status of the first that failed (128+N for signal N).
    """
    for program in dict.fromkeys(cmd[0] for cmd in commands):
        require_program(program, SSH_HINT)
    procs: list[subprocess.Popen] = []
    try:
        with _signals_raise():
            for cmd in commands:
                procs.append(subprocess.Popen(list(cmd), stdin=subprocess.PIPE, start_new_session=True))
            verdict = _FirstCause()
            while True:
                running = [p for p in procs if p.poll() is None]
                failed = [(i, _status(p.returncode)) for i, p in enumerate(procs) if p.returncode not in (None, 0)]
                chosen = verdict.pick(failed, still_running=bool(running))
                if chosen is not None:
                    index, status, _ = chosen
                    rest = "; stopping the other hosts" if running else ""
                    print(
                        f"shoal launch: {labels[index]} exited with status {status}{rest}", file=sys.stderr, flush=True
                    )
                    _stop(running, by_stdin=True)
                    return status
                if not running:
                    return 0
                time.sleep(0.1)
    except _Stop as stop:
        print(f"shoal launch: stopping every host ({signal.Signals(stop.signum).name})", file=sys.stderr, flush=True)
        _stop(procs, by_stdin=True)
        return 128 + stop.signum
    finally:
        for proc in procs:
            _close_stdin(proc)


def _stop(procs: Sequence[subprocess.Popen], *, by_stdin: bool) -> None:
    """Ask each process to stop (close stdin, or SIGTERM), wait ``GRACE_S``, then SIGKILL."""
    stop_with_grace(
        procs,
        running=lambda proc: proc.poll() is None,
        ask=_close_stdin if by_stdin else lambda proc: _signal(proc, signal.SIGTERM),
        kill=lambda proc: _signal(proc, signal.SIGKILL),
        grace_s=GRACE_S,
    )


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the process and whatever it started in its session
    except ProcessLookupError:
        pass


def _close_stdin(proc: subprocess.Popen) -> None:
    if proc.stdin is not None and not proc.stdin.closed:
        try:
            proc.stdin.close()
        except OSError:
            pass


def _status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode
