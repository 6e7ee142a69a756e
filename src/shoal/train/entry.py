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
    writing checkpoints into a directory a rerun is about to resume from.
    """
    die_with_parent()
    return run_worker(cfg)


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent exits (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(128 + signal.SIGKILL)
