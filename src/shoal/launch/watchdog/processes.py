"""How the watchdog acts on the processes of this node (signals, Linux ``/proc``):

- every thread's stack of a rank (:func:`dump_stacks`, :func:`dump_all_stacks`), as its faulthandler
  writes it on the stacks signal (SIGUSR2): works while the rank is blocked in a collective, and for
  many ranks at once;
- stopping for good (:func:`stop_processes`: SIGTERM, then SIGKILL after the grace; a rank blocked in a
  gloo collective runs no Python signal handler, so SIGTERM alone may never stop it);
- a process's children and descendants, and its start time (to tell it from a later one with its
  PID)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from shoal.progress import RankProgress
from shoal.stopping import stop_with_grace


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


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent, the agent) is gone; reaping is the parent's.
    return not _zombie(pid)


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (proc(5)'s field N is item N - 3: the
    state first), or None when the process is gone (Linux; None elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _zombie(pid: int) -> bool:
    fields = stat_fields(pid)
    return fields is not None and fields[0] == "Z"


def stop_processes(pids: Iterable[int], grace_s: float = 10.0) -> list[int]:
    """SIGTERM to each of ``pids``; SIGKILL to those still there after ``grace_s``; wait until all are
    gone. Returns the PIDs that needed SIGKILL (for example a rank blocked in a collective)."""
    return stop_with_grace(
        list(pids),
        running=alive,
        ask=lambda pid: _signal(pid, signal.SIGTERM),
        kill=lambda pid: _signal(pid, signal.SIGKILL),
        grace_s=grace_s,
    )


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
    fields = stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (ValueError, IndexError):
        return None


def is_helper(pid: int) -> bool:
    """A multiprocessing helper (resource tracker, fork server) rather than a worker."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"multiprocessing" in cmdline and (b"resource_tracker" in cmdline or b"forkserver" in cmdline)
