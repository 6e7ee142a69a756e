"""The function every rank of a ``shoal train`` job runs (module-level, so spawn can pickle it)."""

from __future__ import annotations

from typing import Any

from shoal.console import write_line
from shoal.errors import ShoalError
from shoal.train.config import TrainConfig
from shoal.train.trainer import TrainResult


def run_worker(cfg: TrainConfig, started_by: str | None = None, launch: dict[str, Any] | None = None) -> TrainResult:
    """Train as one rank of the job; a ShoalError becomes its message and exit status.

    In a worker of a local launch the launcher reports the failure with this rank's output; in a
    rank started by another launcher (torchrun, srun, mpirun) the message is all there is.
    """
    from shoal.train.trainer import train

    try:
        return train(cfg, started_by=started_by, launch=launch)
    except ShoalError as err:
        if not getattr(err, "quiet", False):
            write_line(err.format())
        raise SystemExit(err.exit_code) from None
