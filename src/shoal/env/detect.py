"""Which launcher started this process: the ordered list of schemes and the one function that picks.

Schemes are tried in this order; the first whose ``detect`` matches describes the process:

1. ``torchrun``: torch's elastic agent (and the legacy ``torch.distributed.launch``). First because
   torchrun is often started *by* another scheme (``srun torchrun ...``, torchrun in an sbatch
   script or a Kubeflow pod) and its workers inherit that scheme's variables, but only torchrun's
   describe the worker itself.
2. ``slurm``: an ``srun`` job step. Only a step's variables (SLURM_STEP_ID) count, so ``python``
   run directly in an sbatch script or salloc shell is not mistaken for rank 0 of SLURM_NTASKS.
3. ``openmpi``: Open MPI's mpirun (OMPI_COMM_WORLD_*).
4. ``pmi``: MPICH / Intel MPI / Cray PALS (PMI_RANK, PMI_SIZE). After Open MPI because some
   launchers export PMI_* too, and Open MPI's own variables are the more specific.
5. ``kubeflow``: one process per pod with MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and no
   LOCAL_RANK. Late because those four names are generic: any scheme above that also matches knows
   more (local ranks, several processes per node).
6. ``local``: always matches; one process.

``SHOAL_ENV=<name>`` (or ``forced=``) skips detection and uses that scheme's ``describe``, which
names any variable it needs and does not find. ``SHOAL_ENV=auto`` or empty means detect.

If nothing but ``local`` matches while some of torch's own variables (RANK, WORLD_SIZE,
LOCAL_RANK) are set, that is an error rather than a silent single-process run: torch would read
them, and a half-set launcher environment is almost always a mistake.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from shoal.env.base import EnvInfo, LaunchEnvironment
from shoal.env.kubeflow import KubeflowEnvironment
from shoal.env.local import LocalEnvironment
from shoal.env.openmpi import OpenMPIEnvironment
from shoal.env.pmi import PMIEnvironment
from shoal.env.slurm import SlurmEnvironment
from shoal.env.torchrun import TorchrunEnvironment
from shoal.errors import ShoalError

SCHEMES: list[type[LaunchEnvironment]] = [
    TorchrunEnvironment,
    SlurmEnvironment,
    OpenMPIEnvironment,
    PMIEnvironment,
    KubeflowEnvironment,
    LocalEnvironment,
]
"""Launch schemes in the order they are tried (see the module docstring for why)."""

_TORCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def scheme_names() -> list[str]:
    return [scheme.name for scheme in SCHEMES]


def get_scheme(name: str) -> type[LaunchEnvironment]:
    """The scheme called ``name``; ShoalError listing the valid names otherwise."""
    for scheme in SCHEMES:
        if scheme.name == name.strip().lower():
            return scheme
    raise ShoalError(
        f"unknown launch scheme {name!r} (from SHOAL_ENV or --scheme)",
        f"use one of: {', '.join(scheme_names())}, or unset SHOAL_ENV to detect it",
    )


def detect_environment(
    environ: Mapping[str, str] | None = None,
    *,
    forced: str | None = None,
    argv: Sequence[str] | None = None,
) -> EnvInfo:
    """Where this process sits in its job, from ``environ`` (default: a copy of ``os.environ``).

    Args:
        environ: the variables to read; never modified.
        forced: a scheme name to use instead of detecting; default ``environ["SHOAL_ENV"]``.
        argv: the command line, for the legacy ``--local_rank`` flag; default ``sys.argv``.

    Raises:
        ShoalError: unknown forced name, or variables missing, not integers or inconsistent.
    """
    environ = dict(os.environ) if environ is None else environ
    name = forced if forced is not None else environ.get("SHOAL_ENV", "")
    if name.strip() and name.strip().lower() != "auto":
        return get_scheme(name).describe(environ, argv=argv)
    for scheme in SCHEMES:
        if scheme.detect(environ, argv=argv):
            if scheme is LocalEnvironment:
                _refuse_stray_torch_vars(environ)
            return scheme.describe(environ, argv=argv)
    raise AssertionError("the local scheme always matches")  # pragma: no cover


def detected_scheme(environ: Mapping[str, str], *, argv: Sequence[str] | None = None) -> type[LaunchEnvironment]:
    """The first scheme of :data:`SCHEMES` whose ``detect`` matches ``environ`` (``local`` at worst).

    Detection only: nothing is described, so nothing raises; ``SHOAL_ENV`` is not consulted.
    """
    return next(scheme for scheme in SCHEMES if scheme.detect(environ, argv=argv))


def torch_env_vars(info: EnvInfo) -> dict[str, str]:
    """The variables ``torch.distributed`` (``env://``) and torchrun-style scripts read, for export.

    MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE are what ``init_process_group("env://")`` reads;
    LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK and GROUP_WORLD_SIZE are what scripts written for
    torchrun read. Exported, they make a child process detect the same place in the job (as
    ``torchrun``). The caller decides whether to export them; nothing here touches ``os.environ``.
    """
    return {
        "MASTER_ADDR": info.main_address,
        "MASTER_PORT": str(info.main_port),
        "RANK": str(info.rank),
        "WORLD_SIZE": str(info.world_size),
        "LOCAL_RANK": str(info.local_rank),
        "LOCAL_WORLD_SIZE": str(info.local_world_size),
        "GROUP_RANK": str(info.node_rank),
        "GROUP_WORLD_SIZE": str(info.num_nodes),
    }


def _refuse_stray_torch_vars(environ: Mapping[str, str]) -> None:
    present = [name for name in _TORCH_VARS[:3] if name in environ]
    if not present:
        return
    missing = [name for name in _TORCH_VARS if name not in environ]
    raise ShoalError(
        f"{', '.join(f'{n}={environ[n]}' for n in present)} set, but not {', '.join(missing)}: "
        "no launch scheme matches",
        "torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR; one process per machine needs RANK, "
        "WORLD_SIZE, MASTER_ADDR, MASTER_PORT; unset stray ones, or force one process with SHOAL_ENV=local",
    )
