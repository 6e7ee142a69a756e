"""When to checkpoint: every N epochs (``2``, ``2epochs``) or every N optimizer steps (``500steps``).

Both count what is done: ``2epochs`` saves after the 2nd, 4th, 6th... completed epoch, ``500steps``
after the 500th, 1000th... optimizer step. How the caller numbers its epochs (from 0 or from 1) is
the :class:`~shoal.checkpoint.manager.CheckpointManager`'s business; a cadence sees counts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shoal.errors import ShoalError

_PATTERN = re.compile(r"^\s*(\d+)\s*(epochs?|steps?)?\s*$")


@dataclass(frozen=True)
class Cadence:
    """Checkpoint every ``every`` units; ``every == 0``: no periodic checkpoint (a preemption still
    saves one)."""

    every: int
    unit: str = "epoch"

    @classmethod
    def parse(cls, text: str | int | None) -> "Cadence":
        if text is None:
            return cls(0)
        if isinstance(text, int):
            text = str(text)
        if text.strip().lower() in ("off", "never", "none"):
            return cls(0)
        match = _PATTERN.match(text.lower())
        if not match:
            raise ShoalError(
                f"--checkpoint-every {text!r} is not a count of epochs or steps",
                "write it as 2 (epochs), 2epochs or 500steps (0 or off: only at the end)",
            )
        unit = "step" if (match.group(2) or "").startswith("step") else "epoch"
        return cls(int(match.group(1)), unit)

    def due(self, *, step: int, epochs_done: int, epoch_end: bool) -> bool:
        """True when the state should be saved: after optimizer step number ``step`` inside an epoch
        (step cadences), or at the end of the epoch that makes ``epochs_done`` completed epochs
        (epoch cadences). Each kind of cadence saves only at its own kind of moment, so the end of an
        epoch never saves a step's state twice."""
        if self.every <= 0:
            return False
        if self.unit == "step":
            return not epoch_end and step % self.every == 0
        return epoch_end and epochs_done % self.every == 0

    def __str__(self) -> str:
        if self.every <= 0:
            return "off"
        return f"every {self.every} {self.unit}{'s' if self.every > 1 else ''}"
