"""Exact job-wide numbers for a tracker, from each rank's own numbers, in one all-reduce.

A tracker does no collective (it lives on rank 0 alone), so whatever it is given must already be
the job's number. This is the helper for users' own loops; ``shoal train`` reduces its own
metrics the same way before it logs them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def reduce_metrics(values: Mapping[str, Any], *, count: Any = None, sums: Iterable[str] = ()) -> dict[str, float]:
    """The job's value of every number in ``values`` (collective: call it on every rank alike).

    Each value is this rank's mean over its ``count`` samples (a float or a one-element tensor);
    the result is the mean over every sample of the job, ``sum(count_r * value_r) / sum(count_r)``:
    exact when ranks hold different numbers of samples, where a mean of the ranks' means is not.
    Without ``count`` every rank weighs the same (a plain mean over ranks). Names in ``sums`` are
    totals instead (``correct``, ``samples``): they are summed. Everything travels as float64 in
    a single all-reduce, and every rank gets the result::

        stats = reduce_metrics({"loss": loss.item(), "correct": correct}, count=len(batch), sums=["correct"])
        tracker.log(stats, step=step)          # a no-op on ranks other than 0
    """
    import torch

    from shoal.distributed import collectives

    names = list(values)
    summed = set(sums)
    unknown = summed - set(names)
    if unknown:
        raise ValueError(f"sums names {sorted(unknown)} that are not in values")
    weight = 1.0 if count is None else _number(count)
    packed = [_number(values[name]) * (1.0 if name in summed else weight) for name in names]
    device = collectives.collective_device()  # CUDA under NCCL, else CPU
    totals = collectives.all_reduce_sum(torch.tensor([*packed, weight], dtype=torch.float64, device=device)).tolist()
    total_weight = totals[-1]
    return {
        name: totals[i] if name in summed else (totals[i] / total_weight if total_weight else float("nan"))
        for i, name in enumerate(names)
    }


def _number(value: Any) -> float:
    return float(value.item() if hasattr(value, "item") else value)
