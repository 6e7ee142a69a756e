"""Timing helpers shared by the benchmarks: clocks that wait for the device, medians, rotations."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")


def sync(device) -> None:
    """Wait for queued work on ``device`` (CUDA kernels run asynchronously; the CPU needs nothing)."""
    if getattr(device, "type", str(device).split(":")[0]) == "cuda":
        import torch

        torch.cuda.synchronize(device)


def clock(device=None) -> float:
    """``time.perf_counter()`` after everything queued on ``device`` has finished."""
    if device is not None:
        sync(device)
    return time.perf_counter()


def median(values: Iterable[float]) -> float:
    """The median of ``values`` (NaN when there are none)."""
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def rotations(items: Sequence[T], rounds: int) -> list[list[T]]:
    """``rounds`` orderings of ``items``, each rotated by one, for interleaved measurements.

    Running A B C, B C A, C A B spreads slow periods of a shared machine over every variant and
    keeps any variant from always going first (cold caches) or last.
    """
    items = list(items)
    n = len(items) or 1
    return [items[r % n :] + items[: r % n] for r in range(rounds)]


def load_average() -> float | None:
    """The 1-minute load average (how busy the machine was), or None where unknown."""
    try:
        import os

        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None
