"""What every worker process needs from its launcher, whoever started it: die with the launcher,
start with default signal handlers, and write whole lines."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent exits (no-op elsewhere).

    The agent stops the workers on a failure or on SIGTERM/SIGINT, but a launcher killed with
    SIGKILL (or by the OOM killer) would otherwise leave them running, maybe blocked forever in a
    collective, or writing checkpoints into a directory a rerun is about to resume from. The flag
    survives exec and fires when the launcher thread that started the worker exits (torch starts
    workers from the main thread). If the parent is already gone, stop right here.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(128 + signal.SIGKILL)


def reset_inherited_signal_handlers() -> None:
    """Give a forked worker the signal handlers a spawned one starts with.

    A forked worker inherits the Python-level handlers of its launcher: torch's elastic agent
    installs one for SIGTERM, SIGINT, SIGHUP and SIGQUIT that raises ``SignalException`` (meant for
    the agent). A worker keeping it would, for a SIGTERM before training starts, fail with that
    exception and exit 1 instead of being terminated by the signal as a spawned worker is.
    Handlers set by the C level or to SIG_IGN (SIGPIPE, ignored by every Python) are left alone;
    :class:`shoal.preemption.PreemptionWatch` installs its own handlers while training.
    """
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


def signal_name(signum: int) -> str:
    """``15`` -> ``SIGTERM``."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def process_started() -> float:
    """``time.monotonic()`` at which this process started (now, if that cannot be read)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
        return time.monotonic() - max(0.0, age)
    except (OSError, ValueError, IndexError):
        return time.monotonic()


def temporary_run_dir(prefix: str) -> str:
    """A new temporary directory ``<prefix><pid>-<random>`` for this launch (worker logs, progress),
    after removing those a dead launcher left: one killed with SIGKILL never ran its clean-up.

    The launcher's PID in the name says whose a directory is; one whose PID no longer runs is
    removed unless it holds a hang report (``hang-*``, kept on purpose and named when it was written).
    """
    root = tempfile.gettempdir()
    for path in glob.glob(os.path.join(glob.escape(root), f"{glob.escape(prefix)}*-*")):
        pid = os.path.basename(path)[len(prefix) :].split("-", 1)[0]
        if pid.isdigit() and not _running(int(pid)) and not glob.glob(os.path.join(glob.escape(path), "hang-*")):
            shutil.rmtree(path, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
