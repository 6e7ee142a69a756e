"""Stopping processes for good: ask each to stop, give them a grace, then kill those still there.

Torch-free and independent of how a process is reached, so that the watchdog (PIDs of ranks it did
not start, read from ``/proc``) and ``shoal launch`` (its own ``subprocess.Popen`` children, stopped
by SIGTERM to their session or by closing their stdin) share one sequence. SIGTERM alone is not
enough: a rank blocked in a gloo collective runs no Python signal handler until the collective
returns, which may be never.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

KILL_WAIT_S = 10.0
"""How long killed processes get to be gone (reaped, or out of ``/proc``) before the call returns."""


def stop_with_grace(
    targets: Sequence[T],
    *,
    running: Callable[[T], bool],
    ask: Callable[[T], None],
    kill: Callable[[T], None],
    grace_s: float,
    poll_s: float = 0.05,
) -> list[T]:
    """``ask`` each running target to stop; ``kill`` those still ``running`` after ``grace_s``; wait
    up to :data:`KILL_WAIT_S` for them to be gone. Returns the targets that had to be killed.

    ``running`` is polled (every ``poll_s``): for a child process it should reap it (``Popen.poll``).
    """
    asked = [target for target in targets if running(target)]
    for target in asked:
        ask(target)
    _wait_gone(asked, running, time.monotonic() + grace_s, poll_s)
    killed = [target for target in asked if running(target)]
    for target in killed:
        kill(target)
    _wait_gone(killed, running, time.monotonic() + KILL_WAIT_S, poll_s)
    return killed


def _wait_gone(targets: Sequence[T], running: Callable[[T], bool], deadline: float, poll_s: float) -> None:
    while any(running(target) for target in targets) and time.monotonic() < deadline:
        time.sleep(poll_s)
