"""Workloads: the public :class:`~shoal.workloads.base.Workload` contract and the bundled ones.

A workload is named by a spec (:mod:`shoal.workloads.spec`): a bundled name (``digits``, ``mnist``,
``cifar10``, ``synthetic``), ``pkg.module:Name`` or ``path/to/file.py:Name``. The bundled ones are
loaded only when asked for; this package's ``__init__`` imports no torch, so the command line can
list their names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shoal.workloads.spec import BUNDLED, label, resolve, short_name

if TYPE_CHECKING:
    from shoal.workloads.base import Workload

WORKLOADS: dict[str, str] = BUNDLED
"""The bundled workloads: name -> ``module:Class``."""
WORKLOADS.setdefault("language", "shoal.workloads.language:Language")


def get_workload(spec: str | Workload) -> Workload:
    """The workload ``spec`` names (an instance is returned as it is); a bad spec is a ShoalError."""
    if isinstance(spec, str):
        return resolve(spec)
    from shoal.workloads.base import Workload

    if not isinstance(spec, Workload):
        from shoal.errors import ShoalError

        raise ShoalError(
            f"a workload must be a spec string or a shoal.Workload, got a {type(spec).__name__}",
            "pass 'digits', 'pkg.module:Name', 'path/to/file.py:Name' or an instance of your Workload subclass",
        )
    return spec


def workload_defaults(spec: str | Workload) -> dict[str, Any]:
    """The training defaults of a workload (epochs, batch_size, lr, ...)."""
    return dict(get_workload(spec).defaults)


__all__ = ["WORKLOADS", "get_workload", "label", "short_name", "workload_defaults"]
