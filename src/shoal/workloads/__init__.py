"""Ready workloads for ``shoal train``: one module each, loaded only when asked for.

This package's ``__init__`` imports no torch, so the command line can list the names.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from shoal.errors import ShoalError

if TYPE_CHECKING:
    from shoal.workloads.base import Workload

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


def workload_defaults(name: str) -> dict[str, Any]:
    """The training defaults of workload ``name`` (epochs, batch_size, lr, ...)."""
    return dict(get_workload(name).defaults)


__all__ = ["WORKLOADS", "get_workload", "workload_defaults"]
