"""Preemption: a SIGTERM or SIGUSR1 on any rank makes every rank stop at the same step.

Slurm sends SIGTERM (and, with ``--signal``, SIGUSR1 ahead of its time limit), Kubernetes sends
SIGTERM to the pod, torch's elastic agent forwards SIGTERM to its workers; ``kill`` may hit just
one rank. The handler only records the signal. :meth:`PreemptionWatch.requested` is called once per
step; every few steps the ranks combine their flags with an all-reduce (MAX) started asynchronously
and read at the next check, so the check never stalls the step and every rank reads the same value
and stops after the same step. The same all-reduce carries the slowest rank's seconds per step, from
which every rank derives the same number of steps until the next check (about every
``CHECK_INTERVAL_S``): a tiny model's millisecond steps do not each pay for a collective, and a
signal is still acted on within a fraction of a second. A watchdog ends the process after
``grace_s`` seconds in any case, so a rank never outlives its grace period.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from shoal.console import write_line
from shoal.env.grace import PREEMPT_GRACE_S
from shoal.errors import ShoalError

PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
CHECK_INTERVAL_S = 0.05
"""Seconds of training between two agreement all-reduces (at least one step, at most ``MAX_STEPS``)."""
MAX_STEPS = 100


class Preempted(ShoalError):
    """Raised on every rank after the preemption checkpoint is written."""


class PreemptionWatch:
    """Context manager: install the handlers, answer :meth:`requested` once per step."""

    def __init__(self, grace_s: float = PREEMPT_GRACE_S, signals: tuple[int, ...] = PREEMPTION_SIGNALS) -> None:
        self.grace_s = grace_s
        self.signals = signals
        self.received = 0
        self._previous: dict[int, Any] = {}
        self._pending: tuple[Any, torch.Tensor] | None = None
        self._steps = 0  # steps since the last check
        self._interval = 1  # steps between checks: the same on every rank (derived from agreed values)
        self._last_check = time.perf_counter()
        self._group = None
        self._watchdog: threading.Timer | None = None
        self._announced = False
        self._distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    def __enter__(self) -> "PreemptionWatch":
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        if self._distributed and dist.get_backend() != "gloo":
            # Flags travel on the CPU over gloo: a CUDA tensor would need a host sync every step.
            self._group = dist.new_group(backend="gloo")
        return self

    def __exit__(self, *exc: object) -> None:
        self._drain()
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
        if self._watchdog is not None and exc[0] is None:
            self._watchdog.cancel()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only recorded here: every rank of a job usually gets the signal at once (the launcher
        # forwards it), and one line from rank 0 says it when the ranks agree (see _announce).
        if not self.received:
            self.received = signum
            self._watchdog = threading.Timer(self.grace_s, _give_up, args=(signum, self.grace_s))
            self._watchdog.daemon = True
            self._watchdog.start()

    def requested(self) -> int:
        """The signal every rank agreed to stop for (0: none). Call once per step on every rank."""
        return self._announce(self._agreed())

    def _announce(self, signum: int) -> int:
        if signum and not self._announced:
            self._announced = True
            if not self._distributed or dist.get_rank() == 0:
                write_line(
                    f"shoal: received {signal.Signals(signum).name}: checkpointing after this step, then exiting"
                )
        return signum

    def _agreed(self) -> int:
        if not self._distributed:
            return self.received
        self._steps += 1
        if self._steps < self._interval:
            return 0
        agreed = 0
        if self._pending is not None:
            work, values = self._pending
            work.wait()
            flag, step_s = values.tolist()
            agreed = int(flag)
            self._interval = max(1, min(MAX_STEPS, int(CHECK_INTERVAL_S / max(step_s, 1e-6))))
        now = time.perf_counter()
        values = torch.tensor([float(self.received), (now - self._last_check) / self._steps], dtype=torch.float64)
        work = dist.all_reduce(values, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        self._pending = (work, values)
        self._steps, self._last_check = 0, now
        return agreed

    def _drain(self) -> None:
        if self._pending is not None:
            self._pending[0].wait()
            self._pending = None


def _give_up(signum: int, grace_s: float) -> None:
    write_line(
        f"shoal: no checkpoint within the {grace_s:.0f} s grace period after {signal.Signals(signum).name}; exiting"
    )
    os._exit(128 + signum)
