"""The functions ``shoal train`` workers run (module-level, so spawn can pickle them)."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from shoal.errors import ShoalError
from shoal.train.config import TrainConfig


def run_worker(cfg: TrainConfig) -> dict[str, Any]:
    """Train as one rank of the job; a ShoalError becomes its message and exit status."""
    from shoal.train.trainer import train

    try:
        return train(cfg)
    except ShoalError as err:
        if not getattr(err, "quiet", False):
            print(err.format(), file=sys.stderr, flush=True)
        raise SystemExit(err.exit_code) from None


def run_local_worker(cfg: TrainConfig) -> dict[str, Any]:
    """:func:`run_worker` in a worker started by ``shoal train --nproc``: it dies with its launcher.

    Without this a ``kill -9`` of the launcher (or of its session) leaves the workers training on,
    writing checkpoints into a directory a rerun is about to resume from. The launcher is the
    worker's parent whether it was forked or spawned (torch's elastic agent runs in the launching
    process and starts the workers itself), so this holds for both start methods.
    """
    die_with_parent()
    reset_inherited_signal_handlers()
    return run_worker(cfg)


def reset_inherited_signal_handlers() -> None:
    """Give a forked worker the signal handlers a spawned one starts with.

    A forked worker inherits the Python-level handlers of its launcher: torch's elastic agent
    installs one for SIGTERM, SIGINT, SIGHUP and SIGQUIT that raises ``SignalException`` (meant for
    the agent). A worker keeping it would, for a SIGTERM before training starts, fail with that
    exception and exit 1 instead of being terminated by the signal as a spawned worker is.
    Handlers set by the C level or to SIG_IGN (SIGPIPE, ignored by every Python) are left alone;
    :class:`shoal.preemption.PreemptionWatch` installs its own handlers while training.
    """
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    for sig in signal.valid_signals():
        try:
            handler = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
        if not callable(handler) or handler is signal.default_int_handler:
            continue  # SIG_DFL, SIG_IGN, None (set outside Python) or Python's own SIGINT handler
        try:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        except (OSError, ValueError, RuntimeError):
            pass


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent exits (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(128 + signal.SIGKILL)
