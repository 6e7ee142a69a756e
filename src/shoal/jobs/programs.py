"""The programs a target hands its job to (mpirun, ssh, sbatch, kubectl): found on PATH, or a HINT."""

from __future__ import annotations

import shutil

from shoal.errors import ShoalError


def require_program(name: str, hint: str) -> str:
    """The path of ``name`` on PATH, or ShoalError with ``hint``."""
    path = shutil.which(name)
    if path is None:
        raise ShoalError(f"{name} not found on PATH", hint)
    return path
