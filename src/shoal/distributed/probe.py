"""The checked all-reduce: a sum every rank can verify, waited for with a deadline, and timed.

One implementation for everything that asks "do the collectives work, and how fast": ``shoal demo
all-reduce`` (the first command on a new cluster), ``shoal doctor`` (its cluster-wide all-reduce
probe) and ``shoal bench allreduce`` (the slowest rank's time). Every rank contributes ``rank + 1``
to every element, so each can check the result, ``N (N + 1) / 2``, without a reference.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class CollectiveTimeout(Exception):
    """The collective did not complete within its deadline (a peer is stuck, gone or unreachable)."""


@dataclass(frozen=True)
class CheckedSum:
    """What one checked all-reduce found on this rank."""

    correct: bool
    got: str
    """The value every element holds (``"min..max"`` when they differ)."""
    expected: float
    seconds: float
    nbytes: int


def expected_sum(world: int) -> float:
    """What every element of a checked all-reduce holds: the sum of ``rank + 1`` over all ranks."""
    return world * (world + 1) / 2


def all_reduce_within(tensor: torch.Tensor, timeout_s: float | None = None) -> float:
    """``all_reduce(tensor)`` (sum, in place), waited for at most ``timeout_s`` (None: the process
    group's own timeout); the seconds it took on this rank, the device synchronised.

    Raises:
        CollectiveTimeout: the all-reduce did not finish in time; gloo then closes the connections
            it was waiting on, so the peers fail fast too.
    """
    import torch
    import torch.distributed as dist

    start = time.perf_counter()
    if timeout_s is None:
        dist.all_reduce(tensor)
    else:
        work = dist.all_reduce(tensor, async_op=True)
        _wait(work, timeout_s)
    if tensor.device.type == "cuda":
        torch.cuda.synchronize(tensor.device)
    return time.perf_counter() - start


def _wait(work, timeout_s: float) -> None:
    try:
        work.wait(timedelta(seconds=timeout_s))
    except RuntimeError as err:
        raise CollectiveTimeout(
            f"the all-reduce did not finish within {timeout_s:.1f} s ({str(err).splitlines()[0][-120:]})"
        ) from None


def checked_all_reduce(
    numel: int, *, rank: int, world: int, device: torch.device, timeout_s: float | None = None
) -> CheckedSum:
    """Every rank: all-reduce ``numel`` float32 values of ``rank + 1`` and check the sum.

    Raises:
        CollectiveTimeout: see :func:`all_reduce_within`.
    """
    import torch

    tensor = torch.full((max(1, numel),), float(rank + 1), dtype=torch.float32, device=device)
    seconds = all_reduce_within(tensor, timeout_s)
    expected = expected_sum(world)
    correct = bool(torch.all(tensor == expected))
    got = f"{tensor[0].item():g}" if correct else f"{tensor.min().item():g}..{tensor.max().item():g}"
    return CheckedSum(correct, got, expected, seconds, tensor.numel() * 4)


def slowest(seconds: float, device: torch.device) -> float:
    """The largest of every rank's ``seconds`` (a collective: every rank calls it, every rank gets it).

    What a collective's time means for a job: every rank waits for the slowest.
    """
    import torch
    import torch.distributed as dist

    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())
