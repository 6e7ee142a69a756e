"""Every check of one node, in the table's order: software, devices, resources, launcher and network.

:func:`node_report` runs them for ``shoal doctor`` on one node (``--master``: the way to the master
too), before a node joins a job started by ``shoal doctor`` itself (:func:`blocking_failures` then
says whether joining can work at all), and in every rank of a running job (the master is the job's).
"""

from __future__ import annotations

import socket
from typing import Any

from shoal.doctor.lighthouse import lighthouse_check
from shoal.doctor.model import FAIL, NodeReport
from shoal.doctor.network import hostname_check, launcher_check, master_checks, plan_description, socket_ifname_checks
from shoal.doctor.resources import (
    checkpoint_dir_check,
    cores_check,
    gpu_check,
    nofile_check,
    shm_check,
    visible_devices_check,
)
from shoal.doctor.settings import DoctorSettings
from shoal.doctor.software import software_checks, versions

BLOCKING = (
    "launcher-env", "master-resolves", "route", "master-port", "gloo-socket-ifname", "nccl-socket-ifname", "lighthouse",
)  # fmt: skip
"""Failures that keep a node from joining a job: it must not wait for a rendezvous it cannot reach."""


def node_report(
    settings: DoctorSettings,
    *,
    nproc: int,
    master: tuple[str, int | None] | None = None,
    plan_options: Any = None,
    node_rank: int | None = None,
    ranks: tuple[int, ...] = (),
    across_nodes: bool | None = None,
) -> NodeReport:
    """Run every check of this node.

    Args:
        settings: what the job needs (checkpoint directory, DataLoader workers...).
        nproc: processes on this node (GPUs needed, /dev/shm).
        master: (host, port) of the master; port None: do not check it (a running job already uses it).
        plan_options: :class:`~shoal.launch.options.LaunchOptions` of a job started here: the report
            then lists what it would listen on.
        node_rank, ranks: this node's place in a running job.
        across_nodes: whether the job spans several nodes (default: a master that is not loopback).
    """
    import torch

    checks = software_checks()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    checks += [
        gpu_check(nproc),
        cores_check(nproc),
        visible_devices_check(),
        shm_check(nproc, settings.loader_workers, gpus),
        nofile_check(),
        checkpoint_dir_check(settings),
        launcher_check(),
    ]
    route = None
    if master is not None:
        network, route = master_checks(*master)
    else:
        network = []
    across = master is not None and not (route is not None and route.loopback)
    across = across if across_nodes is None else across_nodes
    checks.append(hostname_check(route.addr if route and not route.loopback else None, across_nodes=across))
    checks += socket_ifname_checks(route.ifname if route and not route.loopback else None)
    checks += network
    master_port = next((check for check in network if check.name == "master-port"), None)
    lighthouse = lighthouse_check(
        settings.lighthouse, fault_tolerance=settings.fault_tolerance, master_port=master_port
    )
    if lighthouse is not None:
        checks.append(lighthouse)
    report = NodeReport(
        host=socket.gethostname(),
        checks=checks,
        versions=versions(),
        address=route.addr if route else None,
        node_rank=node_rank,
        ranks=list(ranks),
    )
    if plan_options is not None and (master is None or route is not None):
        report.plan = plan_description(plan_options)
    return report


def blocking_failures(report: NodeReport) -> list[str]:
    """Names of the failed checks that keep this node from joining a job."""
    return [c.name for c in report.checks if c.status == FAIL and c.name in BLOCKING]
