"""A fault-tolerant job seen from the process that starts it (``shoal train --fault-tolerance``).

It checks what the replica groups need before any starts (one node, two groups at least, the
CPU: groups are forked, and CUDA does not survive a fork), names and prepares the run directory, then runs the groups beside a
supervised lighthouse (:func:`shoal.launch.replica_groups.run_replica_groups`).
"""

from __future__ import annotations

from typing import Any

from shoal.errors import ShoalError
from shoal.launch.options import LaunchOptions
from shoal.launch.replica_groups import DEFAULT_MAX_RESTARTS, run_replica_groups
from shoal.train.config import TrainConfig
from shoal.train.entry import run_worker
from shoal.train.outputs import default_out_dir, prepare_out_dir
from shoal.train.trainer import TrainResult
from shoal.workloads import short_name


def check_replica_launch(options: LaunchOptions, device: str = "cpu") -> None:
    """Refuse what a fault-tolerant launch cannot do yet, before anything starts."""
    if device == "cuda":
        raise ShoalError(
            "--fault-tolerance runs on the CPU for now (its replica groups are forked, and CUDA does not survive a fork)",
            "drop --device cuda (docs/FAULT_TOLERANCE.md says what is built)",
        )
    if options.several_nodes:
        raise ShoalError(
            "--fault-tolerance runs on one node for now (its replica groups are this node's processes)",
            "drop --nnodes (or run one group per node by hand with --lighthouse pointing at one lighthouse)",
        )
    if options.nproc < 2:
        raise ShoalError(
            "--fault-tolerance with one replica group has nobody to fail over to",
            "pass --nproc 2 or more: each process is a replica group",
        )
    if options.start_method == "spawn":
        raise ShoalError("--fault-tolerance forks its replica groups", "drop --start-method spawn")


def run_replica_job(cfg: TrainConfig, options: LaunchOptions, *, workload: Any = None) -> TrainResult | None:
    """Train ``cfg`` as ``options.nproc`` replica groups on the CPU; group 0's result."""
    check_replica_launch(options, cfg.device)
    cfg = cfg.replace(device="cpu")
    if cfg.out is None:
        cfg = cfg.replace(out=default_out_dir(short_name(cfg.workload)))
    cfg = cfg.replace(out=str(prepare_out_dir(cfg.out)))
    results = run_replica_groups(
        run_worker,
        (cfg, "fork", None, workload),
        groups=options.nproc,
        max_restarts=options.max_restarts or DEFAULT_MAX_RESTARTS,
        lighthouse=cfg.lighthouse,
    )
    return results.get(0)
