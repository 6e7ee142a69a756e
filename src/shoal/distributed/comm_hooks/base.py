"""What every communication hook is: a name, a description, and its state for checkpoints."""

from __future__ import annotations

from typing import Any

DEFAULT_POWERSGD_RANK = 2
"""PowerSGD's approximation rank when none is given (``--powersgd-rank``)."""


class CommHook:
    """What :func:`register_comm_hook` set up: its name, a description, and its state for checkpoints.

    Pass it with a checkpoint's per-rank objects (``ckpt.save(..., per_rank={"comm_hook": hook})``);
    a hook without state saves an empty dict and ignores what it is given.
    """

    def __init__(self, name: str, description: str, *, applied: bool) -> None:
        self.name = name
        self.description = description
        """One line for a job's start-up output (``comm hook NAME: DESCRIPTION``)."""
        self.applied = applied
        """False when nothing was registered (``none``, or a model without DDP)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to load (a checkpoint of a run with another hook may hold PowerSGD's state: ignored)."""
