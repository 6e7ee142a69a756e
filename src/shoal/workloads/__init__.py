"""Ready workloads for ``shoal train``: one module each, loaded only when asked for."""

from __future__ import annotations

import importlib

from shoal.errors import ShoalError
from shoal.workloads.base import Workload, WorkloadData

WORKLOADS: dict[str, str] = {
    "digits": "shoal.workloads.digits:Digits",
    "mnist": "shoal.workloads.mnist:MNIST",
    "cifar10": "shoal.workloads.cifar10:CIFAR10",
    "synthetic": "shoal.workloads.synthetic:Synthetic",
}


def get_workload(name: str) -> Workload:
    """The workload called ``name``; an unknown name is a ShoalError listing the known ones."""
    try:
        target = WORKLOADS[name]
    except KeyError:
        raise ShoalError(
            f"unknown workload {name!r}",
            f"choose one of: {', '.join(WORKLOADS)} (e.g. `shoal train digits`)",
        ) from None
    module_name, class_name = target.split(":")
    return getattr(importlib.import_module(module_name), class_name)()


__all__ = ["WORKLOADS", "Workload", "WorkloadData", "get_workload"]
