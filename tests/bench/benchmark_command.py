"""The project's own benchmarks as their developer runs them: ``python -m benchmarks.NAME ARGS`` from
the repository root (benchmarks/README.md), in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(name: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """``python -m benchmarks.NAME ARGS`` in the repository root; both streams captured as text."""
    env = {k: v for k, v in os.environ.items() if k != "SHOAL_ENV"}
    return subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
