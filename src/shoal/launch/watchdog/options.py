"""The watchdog's settings: the hang timeout's floor and factor, the slow phases, the stop grace,
the straggler window, ``--hang-timeout`` and ``--on-hang`` checked (:func:`hang_options`). Imported
on the ``--help`` path (:mod:`shoal.launch.options`): nothing here imports torch, nor anything but
:mod:`shoal.errors`."""

from __future__ import annotations

import os

from shoal.errors import ShoalError

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
STRAGGLER_WINDOW_ENV = "SHOAL_STRAGGLER_WINDOW_S"
"""Seconds of each straggler window (default 10): a straggler is named after 3 windows in a row."""
WATCHDOG_ENV = "SHOAL_WATCHDOG"
"""``SHOAL_WATCHDOG=0`` in the launcher's environment turns the watchdog off (for an A/B measurement)."""


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


def straggler_window_s() -> float:
    """The straggler window: ``SHOAL_STRAGGLER_WINDOW_S`` seconds, else 10."""
    return float(os.environ.get(STRAGGLER_WINDOW_ENV) or 10.0)
