"""Start N local worker processes running a Python function, through torch's elastic agent.

This is what ``shoal train --nproc N`` uses: the same agent as torchrun (c10d rendezvous on a
port the OS picks, worker monitoring, the rest of the group stopped when one worker fails), with
a function as entrypoint so the workers need no command line of their own.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import uuid
from typing import Any, Callable

from shoal.errors import ShoalError


class WorkersFailed(ShoalError):
    """Some local worker failed; the message already holds its traceback and summary."""

    def format(self) -> str:
        return self.message


def launch_local(
    entrypoint: Callable[..., Any],
    args: tuple[Any, ...],
    nproc: int,
    *,
    max_restarts: int = 0,
    start_method: str = "spawn",
) -> dict[int, Any]:
    """Run ``entrypoint(*args)`` in ``nproc`` worker processes on this machine and wait for them.

    Returns ``{local_rank: return value}``. A failed worker raises :class:`WorkersFailed` carrying
    the failing rank's own traceback; the other workers are stopped by the agent first.
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from shoal.launch.failures import describe_child_failure

    if nproc < 1:
        raise ShoalError(f"--nproc must be at least 1, got {nproc}", "pass --nproc 1 or more")
    log_dir = tempfile.mkdtemp(prefix="shoal-workers-")
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"shoal-{uuid.uuid4().hex[:8]}",
        # c10d on port 0: the agent's store binds a port the OS picks, so concurrent jobs on one
        # machine never collide (what torchrun --standalone does).
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        max_restarts=max_restarts,
        monitor_interval=0.1,
        start_method=start_method,
        logs_specs=DefaultLogsSpecs(log_dir=log_dir),
    )
    try:
        return elastic_launch(config, entrypoint)(*args)
    except ChildFailedError as err:
        report = describe_child_failure(err, log_dir)
        raise WorkersFailed(report.format(), exit_code=report.exit_code) from None
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
        sys.stdout.flush()
