"""Facts about this machine that several layers need: how many cores this process may use."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity, which Slurm, cgroups and taskset restrict
    (``os.cpu_count()`` would count the whole machine)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_process(processes: int) -> int:
    """Usable cores // processes on this node, at least 1 (torchrun sets 1 whatever the machine)."""
    return max(1, usable_cores() // max(1, processes))
