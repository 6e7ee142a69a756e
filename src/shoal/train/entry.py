"""The function every ``shoal train`` worker process runs (picklable, so spawn can start it)."""

from __future__ import annotations

import sys
from typing import Any

from shoal.errors import ShoalError
from shoal.train.config import TrainConfig


def run_worker(cfg: TrainConfig) -> dict[str, Any]:
    """Train as one rank of the job; a ShoalError becomes its message and exit status 2."""
    from shoal.train.trainer import train

    try:
        return train(cfg)
    except ShoalError as err:
        print(err.format(), file=sys.stderr, flush=True)
        raise SystemExit(err.exit_code) from None
