"""Stragglers, judged over data: :class:`StragglerJudge` names a rank whose compute time per step stays
above the others' by a margin for several windows in a row; :func:`straggler_line` says so in one line."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass
class StragglerJudge:
    """A rank straggles when its mean compute time per step, over a window, exceeds ``margin`` x the
    median of the other ranks' for ``persistence`` windows in a row (so a blip is not named)."""

    margin: float = 1.3
    persistence: int = 3
    _streak: dict[int, int] = field(default_factory=dict)

    def window(self, compute_per_step: dict[int, float]) -> list[int]:
        """Feed one window's per-rank mean compute times; returns the ranks judged stragglers now."""
        slow = set()
        if len(compute_per_step) >= 2:
            for rank, mean in compute_per_step.items():
                others = statistics.median(v for r, v in compute_per_step.items() if r != rank)
                if others > 0 and mean > self.margin * others:
                    slow.add(rank)
        for rank in compute_per_step:
            self._streak[rank] = self._streak.get(rank, 0) + 1 if rank in slow else 0
        return sorted(r for r in slow if self._streak[r] >= self.persistence)


def straggler_line(rank: int, host: str, mean: float, others: float) -> str:
    """The one line naming a straggler: its ``mean`` compute per step against the ``others``' median."""
    return (
        f"shoal: rank {rank} (node {host}) straggles: {mean * 1e3:.1f} ms of compute per step "
        f"vs {others * 1e3:.1f} ms for the others ({mean / others:.2f}x)"
    )
