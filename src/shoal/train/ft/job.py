"""A fault-tolerant job seen from the process that starts it (``shoal train --fault-tolerance``).

It decides what the replica groups need before any starts (two groups at least, the master's
address and a shared ``--out`` across nodes, their device: a GPU per process, forked on the CPU and
spawned with CUDA), names and prepares the run directory, then runs this node's groups, node 0's
beside a supervised lighthouse (:func:`shoal.train.ft.supervisor.run_replica_groups`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from shoal.console import write_line
from shoal.distributed.device import choose_backend, visible_gpus, workers_device
from shoal.env.detect import detect_environment
from shoal.env.network import bracket, route_to
from shoal.errors import ShoalError
from shoal.launch.local import Placement, placement, resolve_start_method
from shoal.launch.options import LaunchOptions
from shoal.train.config import TrainConfig
from shoal.train.entry import train_rank
from shoal.train.ft.loop import train_replica
from shoal.train.ft.supervisor import DEFAULT_MAX_RESTARTS, run_replica_groups
from shoal.train.outputs import default_out_dir, prepare_out_dir
from shoal.train.trainer import TrainResult
from shoal.workloads import short_name

DEFAULT_LIGHTHOUSE_PORT = 29500
"""Across nodes, node 0's lighthouse listens on ``--master-port``, by default torchrun's port: a
fault-tolerant job has no other store on the master."""


@dataclass(frozen=True)
class ReplicaPlan:
    """This node's share of a fault-tolerant job, decided once before any group starts
    (:func:`plan_replica_job`)."""

    options: LaunchOptions
    """The launch options as this node's share of the job (one rank of an outer launcher: a node)."""
    group_nproc: int
    """Processes per replica group."""
    device: str
    """What every group's processes compute on: ``cuda`` or ``cpu``."""
    start_method: str
    """How the groups' processes start: fork on the CPU, spawn with CUDA (it does not survive a fork)."""
    gpus: tuple[str, ...] = ()
    """With CUDA: the node's GPUs, handed out to the groups' processes in order (one each; groups
    of one process over gloo may share them)."""

    @property
    def groups(self) -> int:
        """This node's replica groups."""
        return self.options.nproc // self.group_nproc


def plan_replica_job(
    options: LaunchOptions, *, nproc_per_group: int | None = None, strategy: str = "ddp",
    device: str = "auto", backend: str = "auto",
) -> ReplicaPlan:  # fmt: skip
    """Refuse what a fault-tolerant launch cannot do, before anything starts, and decide this node's
    share: its groups (``--nproc-per-group``; default 1, under FSDP the node's ``--nproc``: one group
    per node; whole groups, two at least in the job), their device and how they start."""
    options = _as_job_rank(options)
    if options.several_nodes:
        _check_nodes(options)
    elif options.nproc < 2:
        raise ShoalError(
            "--fault-tolerance with one replica group has nobody to fail over to",
            "pass --nproc 2 or more: each process is a replica group",
        )
    size = _group_nproc(options, nproc_per_group, strategy)
    gpus = _group_gpus(options.nproc, size, device, backend)
    compute = "cuda" if gpus else "cpu"
    choose_backend(backend, torch.device(compute))  # what every group would say (nccl on the CPU), said here once
    return ReplicaPlan(options, size, compute, resolve_start_method(options.start_method, compute), tuple(gpus))


def _group_nproc(options: LaunchOptions, nproc_per_group: int | None, strategy: str) -> int:
    size = nproc_per_group if nproc_per_group is not None else (options.nproc if strategy == "fsdp" else 1)
    if size == 1:
        return 1
    if placement(options) is Placement.RANK:
        raise ShoalError(
            f"--nproc-per-group {size} under another launcher: each of its ranks is one replica group of one process",
            "start one shoal train per node (no outer launcher's ranks) and let it start the groups of "
            f"--nproc-per-group {size} (docs/FAULT_TOLERANCE.md)",
        )
    if options.nproc % size:
        raise ShoalError(
            f"--nproc-per-group {size} does not divide this node's --nproc {options.nproc} into whole replica groups",
            f"pass --nproc {size * 2} --nproc-per-group {size} for 2 groups of {size}",
        )
    if options.node_counts[0] * options.nproc // size < 2:
        raise ShoalError(
            f"--fault-tolerance with one replica group (--nproc {options.nproc} in groups of {size}) has nobody to "
            "fail over to",
            f"pass --nproc {size * 2} --nproc-per-group {size} (2 groups of {size}), or run on several nodes",
        )
    return size


def _group_gpus(nproc: int, group_nproc: int, device: str, backend: str) -> list[str]:
    """The GPUs this node's groups compute on; none: the CPU. The device is chosen as for a plain
    launch (:func:`~shoal.distributed.device.workers_device`: ``auto`` takes the GPUs when there is
    one per process, ``cuda`` needs one per process), except that groups of one process whose
    replicas meet over gloo (``--backend gloo``) may share the GPUs: then one will do."""
    if device == "cpu":
        return []
    shared = device == "cuda" and backend == "gloo" and group_nproc == 1
    chosen = workers_device(device, 1 if shared else nproc, spawned=False)
    return visible_gpus() if chosen.type == "cuda" else []


def run_replica_job(cfg: TrainConfig, plan: ReplicaPlan, *, workload: Any = None) -> TrainResult | None:
    """Train ``cfg`` as this node's replica groups (``plan``, from :func:`plan_replica_job`); group
    0's result (None on the other nodes). ``workload``: what the groups' :func:`train_rank` gets (the
    instance when they are forked, a parcel of it or None when they are spawned)."""
    options = plan.options
    cfg = cfg.replace(device=plan.device)
    if cfg.out is None and options.several_nodes:
        raise ShoalError(
            "--fault-tolerance across nodes needs --out",
            "pass --out DIR on storage every node can see (a restarted group's checkpoints and logs live there)",
        )
    if cfg.out is None:
        cfg = cfg.replace(out=default_out_dir(short_name(cfg.workload)))
    cfg = cfg.replace(out=str(prepare_out_dir(cfg.out)))
    place = _addresses(options, cfg.lighthouse)
    results = run_replica_groups(
        train_rank,
        (cfg, plan.start_method, None, workload, train_replica),
        groups=plan.groups,
        group_nproc=plan.group_nproc,
        max_restarts=options.max_restarts or DEFAULT_MAX_RESTARTS,
        lighthouse=place.lighthouse,
        host=place.host,
        first=options.node_rank * plan.groups,
        total=options.node_counts[0] * plan.groups,
        lighthouse_port=place.lighthouse_port,
        hang_timeout=options.hang_timeout,
        run_dir=cfg.out,
        start_method=plan.start_method,
        gpus=plan.gpus,
    )
    return results.get(0)


def _as_job_rank(options: LaunchOptions) -> LaunchOptions:
    """Started as one rank of a job another launcher started (``shoal launch --hosts``, ``shoal
    run --nnodes``, torchrun, mpirun: :data:`~shoal.launch.local.Placement.RANK`), this process is
    a node of one replica group: group RANK of WORLD_SIZE, supervised here (the outer launcher never
    sees it fail). Rank 0 serves the lighthouse on the master's port + 1: the master's port is the
    outer launcher's store."""
    if placement(options) is not Placement.RANK:
        return options
    env = detect_environment()
    return dataclasses.replace(
        options,
        nnodes=str(env.world_size),
        node_rank=env.rank,
        master_addr=env.main_address,
        master_port=env.main_port + 1,
    )


def _check_nodes(options: LaunchOptions) -> None:
    """Several nodes: a fixed number of them, and the master's address (node 0 hosts the lighthouse)."""
    if options.rdzv_backend != "static" or options.master_addr is None:
        raise ShoalError(
            "--fault-tolerance across nodes needs --master-addr (node 0, which hosts the lighthouse)",
            "pass --nnodes N --node-rank R --master-addr ADDR on every node (no --rdzv-backend)",
        )


@dataclass(frozen=True)
class _Addresses:
    """Where this node's groups listen, and the lighthouse they use (None: start one here)."""

    host: str
    lighthouse: str | None
    lighthouse_port: int | None = None


def _addresses(options: LaunchOptions, lighthouse: str | None) -> _Addresses:
    """One node: loopback. Several: the address shoal picks toward the master (``--local-addr``
    wins); node 0 serves the lighthouse there on ``--master-port`` (default
    :data:`DEFAULT_LIGHTHOUSE_PORT`), the others reach it at the master's address, never a name."""
    if not options.several_nodes:
        return _Addresses("127.0.0.1", lighthouse)
    route = route_to(options.master_addr or "")
    host = options.local_addr or route.addr
    port = options.master_port or DEFAULT_LIGHTHOUSE_PORT
    if lighthouse is None and options.node_rank != 0:
        # The master on this machine (a name mapped to 127.x here): node 0 serves on the same
        # outward address this node chose, not on the loopback address the name resolves to.
        served = route.addr if route.master_is_local else route.master_ip
        lighthouse = f"http://{bracket(served)}:{port}"
    write_line(
        f"shoal: network: replica groups of node {options.node_rank} on {host}"
        f"{f' ({route.ifname})' if route.ifname else ''}; "
        + (f"lighthouse {lighthouse}" if lighthouse else f"serving the lighthouse on {bracket(host)}:{port}")
    )
    return _Addresses(host, lighthouse, port)
