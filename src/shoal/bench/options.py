"""Checks shared by the benchmarks' config dataclasses: one line and a hint per bad option."""

from __future__ import annotations

from typing import Any

from shoal.errors import ShoalError


def require_at_least(cfg: Any, minimum: int, *names: str) -> None:
    """Raise a ShoalError naming the flag (``--batch-size``) of the first field below ``minimum``."""
    for name in names:
        value = getattr(cfg, name)
        if value < minimum:
            flag = "--" + name.replace("_", "-")
            floor = "at least 1" if minimum == 1 else f"{minimum} or more"
            raise ShoalError(f"{flag} must be {floor}, got {value}", f"pass {flag} {minimum} or more")
