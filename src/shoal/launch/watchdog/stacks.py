"""Every thread's stack of a rank, as its faulthandler writes it on the stacks signal (SIGUSR2): works
while the rank is blocked in a collective, and for many ranks at once."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from shoal.progress import RankProgress


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
