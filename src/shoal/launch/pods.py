"""A Kubernetes pod whose command is ``shoal train`` or ``shoal run``: the operator's variables as
launch options, so the pod needs no launch script.

Kubeflow's training-operator (PyTorchJob) and Trainer v2 (TrainJob) give each pod torchrun's flags
as ``PET_*`` variables (``PET_NNODES``, ``PET_NODE_RANK``, ``PET_NPROC_PER_NODE``, ``PET_MASTER_ADDR``,
``PET_MASTER_PORT``, and ``PET_RDZV_*`` for elastic jobs); torchrun reads them as the defaults of
its flags, and so does ``shoal run`` (it uses torchrun's parser). :func:`operator_defaults` gives
``shoal train``, ``shoal demo`` and ``shoal.fit`` the same defaults, under the same rule: flags
given on the command line win.

``WORLD_SIZE`` is never read here: training-operator sets it to pods x nprocPerNode since 1.7 and
to the number of pods before, and Trainer v2 does not set it at all. Confusing the two is the
classic PyTorchJob bug (``torchrun --nnodes=$WORLD_SIZE`` waits for twice the pods that exist as
soon as nprocPerNode is 2). The node count comes from ``PET_NNODES`` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shoal.env.base import read_int, read_port
from shoal.errors import ShoalError


def started_by_operator(environ: Mapping[str, str]) -> bool:
    """True in a pod whose command a Kubeflow operator started (not in the workers shoal starts
    there): PET_NNODES, with a node rank (static) or a rendezvous endpoint (elastic, c10d)."""
    if "PET_NNODES" not in environ or "TORCHELASTIC_RUN_ID" in environ:
        return False
    return any(name in environ for name in ("PET_NODE_RANK", "PET_RDZV_ENDPOINT", "PET_MASTER_ADDR"))


def operator_defaults(environ: Mapping[str, str], *, gpus: int | None = None) -> dict[str, Any]:
    """:class:`~shoal.launch.options.LaunchOptions` field values from the operator's variables.

    Empty when this is not an operator-started pod. ``gpus``: GPUs visible in the pod, for
    ``nprocPerNode: auto`` (one process per GPU, or one per pod on CPU); counted when None.
    """
    if not started_by_operator(environ):
        return {}
    out: dict[str, Any] = {
        "nnodes": environ["PET_NNODES"].strip(),
        "node_rank": read_int(environ, "PET_NODE_RANK") if "PET_NODE_RANK" in environ else 0,
        "rdzv_id": environ.get("PET_RDZV_ID", "").strip() or "shoal",
    }
    nproc = environ.get("PET_NPROC_PER_NODE", "1").strip() or "1"
    out["nproc"] = nproc_from(nproc, "PET_NPROC_PER_NODE", gpus)
    address = environ.get("PET_MASTER_ADDR") or environ.get("MASTER_ADDR")
    if address:
        out["master_addr"] = address.strip()
    port_name = "PET_MASTER_PORT" if "PET_MASTER_PORT" in environ else "MASTER_PORT"
    if port_name in environ:
        out["master_port"] = read_port(environ, port_name)
    backend = environ.get("PET_RDZV_BACKEND", "").strip()
    if backend:
        if backend not in ("static", "c10d"):
            raise ShoalError(
                f"PET_RDZV_BACKEND={backend!r} is not a rendezvous shoal supports",
                "use rdzvBackend: c10d in the job's elasticPolicy (or no elasticPolicy: static)",
            )
        out["rdzv_backend"] = backend
    endpoint = environ.get("PET_RDZV_ENDPOINT", "").strip()
    if endpoint:
        out["rdzv_endpoint"] = endpoint
        out.setdefault("rdzv_backend", "c10d")
    if ":" in out["nnodes"] and "rdzv_backend" not in out:
        out["rdzv_backend"] = "c10d"
    if out.get("rdzv_backend") == "c10d" and not endpoint and "master_addr" in out:
        out["rdzv_endpoint"] = f"{out['master_addr']}:{out.get('master_port', 29400)}"
    if "PET_MAX_RESTARTS" in environ:
        out["max_restarts"] = read_int(environ, "PET_MAX_RESTARTS")
    return out


def nproc_from(value: str, name: str, gpus: int | None = None) -> int:
    """A process count: an integer, or ``auto``/``gpu`` (one per visible GPU, or 1 without any)."""
    value = value.strip().lower()
    if value.lstrip("-").isdigit():
        if int(value) < 1:
            raise ShoalError(f"{name} must be at least 1, got {value}", "give the number of worker processes, e.g. 2")
        return int(value)
    if value in ("auto", "gpu"):
        if gpus is None:
            import torch

            gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if value == "gpu" and gpus == 0:
            raise ShoalError(f"{name}=gpu but this machine has no visible GPU", "use a number, or auto")
        return max(1, gpus)
    raise ShoalError(f"{name}={value!r} is neither a number of processes nor auto", "use e.g. 2, or auto")
