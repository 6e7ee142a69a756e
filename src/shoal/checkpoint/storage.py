"""Checkpoint files: ``torch.save`` through :mod:`shoal.atomic` (the old file or the new one, never
half of one), and ``torch.load`` that refuses pickled code."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from shoal.atomic import atomic_write


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save(obj)`` to ``path``, atomically and durably."""
    return atomic_write(path, lambda f: torch.save(obj, f))


def torch_load(path: str | os.PathLike, map_location: Any = "cpu") -> Any:
    """Load with ``weights_only=True``: a file that would run code when unpickled is refused."""
    return torch.load(path, map_location=map_location, weights_only=True)
