"""The function every rank of a ``shoal train`` job runs (module-level, so spawn can pickle it)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from shoal.console import write_line
from shoal.errors import ShoalError, first_line
from shoal.launch.failures import says_peer_gone
from shoal.train.config import TrainConfig
from shoal.train.trainer import TrainResult
from shoal.workloads import get_workload
from shoal.workloads.spec import Parcel

QUIET_EXIT_DELAY_S = 2.0


def train_rank(
    cfg: TrainConfig,
    started_by: str | None = None,
    launch_record: dict[str, Any] | None = None,
    workload: Any = None,
    loop: Callable[..., TrainResult] | None = None,
) -> TrainResult:
    """Train as one rank of the job; a ShoalError becomes its message and exit status.

    ``cfg``: resolved by the process that started the job (:func:`shoal.train.job.run_training`).
    ``workload``: the instance to train (forked workers), a :class:`~shoal.workloads.spec.Parcel`
    holding it (spawned workers), or None (the spec ``cfg.workload`` is imported here). ``loop``:
    what trains (module-level, for spawn): the trainer's loop by default; a fault-tolerant job's
    groups run their replica loop (:mod:`shoal.train.ft.loop`), which the trainer does not know.

    In a worker of a local launch the launcher reports the failure with this rank's output; in a
    rank started by another launcher (torchrun, srun, mpirun) the message is all there is. A rank
    whose peer vanished (a node of an elastic job lost) leaves quietly when the launcher will
    restart the group: the launcher's line names the node that left and the new world size.
    """
    if loop is None:
        from shoal.train.trainer import train as loop

    if not cfg.is_resolved:  # a caller's contract, not a user's input
        raise TypeError("train_rank takes a config resolved by the launcher: cfg.resolved(workload)")
    try:
        if isinstance(workload, Parcel):
            workload = workload.open()
        elif workload is None:  # a spawned worker of a named workload: its own import of it
            workload = get_workload(cfg.workload)
        return loop(cfg, workload=workload, started_by=started_by, launch_record=launch_record)
    except ShoalError as err:
        if not getattr(err, "quiet", False):
            write_line(err.format())
        elif os.environ.get("TORCHELASTIC_RUN_ID") is not None:
            # Every rank stops at the same step; rank 0 says why. A quiet rank that exited first
            # would have the agent stop rank 0 before it printed (seen on a loaded machine): it
            # lets rank 0 go first, well within the preemption grace.
            time.sleep(QUIET_EXIT_DELAY_S)
        raise SystemExit(err.exit_code) from None
    except Exception as err:
        if not peer_gone(err):
            raise
        if _restarts_left():
            raise SystemExit(1) from None
        write_line(f"shoal: lost the connection to another rank and no restart is left: {first_line(err)}")
        raise SystemExit(1) from None


def peer_gone(err: BaseException) -> bool:
    """A collective failed because another rank's process or node is gone."""
    import torch.distributed as dist

    return isinstance(err, getattr(dist, "DistNetworkError", ())) or (
        isinstance(err, RuntimeError) and says_peer_gone(str(err))
    )


def _restarts_left() -> bool:
    count = os.environ.get("TORCHELASTIC_RESTART_COUNT", "")
    most = os.environ.get("TORCHELASTIC_MAX_RESTARTS", "")
    return count.isdigit() and most.isdigit() and int(count) < int(most)
