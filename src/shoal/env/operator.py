"""A Kubernetes pod whose command is ``shoal train`` or ``shoal run``: the operator's variables as
launch options (plain dicts of :class:`~shoal.launch.options.LaunchOptions` field values), so the pod
needs no launch script. Pure functions over environment mappings: :mod:`shoal.env` is the one reader
of scheduler variables.

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

Pods that carry only the classic variables (:func:`classic_pod`): MASTER_ADDR, MASTER_PORT, RANK
and WORLD_SIZE, no PET_* (Run:ai's distributed PyTorch workloads on a training-operator before 1.7,
and that operator itself, where WORLD_SIZE counts pods). A launcher there is node RANK of WORLD_SIZE
nodes meeting on MASTER_ADDR:MASTER_PORT, with one process per GPU (one on CPU) unless the command
says otherwise: what Run:ai's users write in their launch scripts (``torchrun --nnodes=$WORLD_SIZE
--node_rank=$RANK --master_addr=$MASTER_ADDR --master_port=$MASTER_PORT``), torchrun's default
(static) rendezvous included. Without this, each pod would start a standalone job of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shoal.env.base import has_all, read_int, read_port, read_rank
from shoal.env.detect import detected_scheme
from shoal.env.kubeflow import KubeflowEnvironment
from shoal.errors import ShoalError

CLASSIC_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
"""What a pod of a PyTorchJob before training-operator 1.7 (and of Run:ai on one) carries: no PET_*."""


def started_by_operator(environ: Mapping[str, str]) -> bool:
    """True in a pod whose command a Kubeflow operator started (not in the workers shoal starts
    there): PET_NNODES, with a node rank (static) or a rendezvous endpoint (elastic, c10d)."""
    if "PET_NNODES" not in environ or "TORCHELASTIC_RUN_ID" in environ:
        return False
    return any(name in environ for name in ("PET_NODE_RANK", "PET_RDZV_ENDPOINT", "PET_MASTER_ADDR"))


def classic_pod(environ: Mapping[str, str]) -> bool:
    """True in a launcher whose environment holds only the classic variables of a multi-pod job:
    MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE (WORLD_SIZE not 1), no PET_* variables, and no
    sign of another launcher (torchrun's LOCAL_RANK or TORCHELASTIC_RUN_ID, Slurm, MPI) that would
    make this process a rank itself. A WORLD_SIZE that is not a number counts: the defaults then
    name it. ``SHOAL_ENV`` forcing a scheme turns it off (``SHOAL_ENV=kubeflow``: this process is
    the pod's one rank, as a plain ``python train.py`` there is)."""
    if started_by_operator(environ) or "PET_NNODES" in environ or not has_all(environ, *CLASSIC_VARS):
        return False
    if environ.get("SHOAL_ENV", "").strip().lower() not in ("", "auto"):
        return False
    if detected_scheme(environ, argv=()) is not KubeflowEnvironment:
        return False
    return environ["WORLD_SIZE"].strip() != "1"


def operator_defaults(environ: Mapping[str, str], *, gpus: int | None = None) -> dict[str, Any]:
    """:class:`~shoal.launch.options.LaunchOptions` field values from the operator's variables.

    Empty when this is not an operator-started pod. ``gpus``: GPUs visible in the pod, for
    ``nprocPerNode: auto`` (one process per GPU, or one per pod on CPU); counted when None.
    In a pod with the classic variables only (:func:`classic_pod`): node RANK of WORLD_SIZE on
    MASTER_ADDR:MASTER_PORT (ShoalError naming them when they disagree), a process per GPU.
    """
    if classic_pod(environ):
        return classic_defaults(environ, gpus=gpus)
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


def classic_defaults(environ: Mapping[str, str], *, gpus: int | None = None) -> dict[str, Any]:
    """LaunchOptions field values for a pod with only MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE."""
    rank, world = read_rank(environ, "RANK", "WORLD_SIZE")
    address = environ["MASTER_ADDR"].strip()
    if not address:
        raise ShoalError(
            "MASTER_ADDR is empty in a pod with RANK and WORLD_SIZE set",
            "the job's master pod address is missing; set MASTER_ADDR (the training operator does)",
        )
    return {
        "nnodes": str(world),
        "node_rank": rank,
        "master_addr": address,
        "master_port": read_port(environ, "MASTER_PORT"),
        "rdzv_backend": "static",
        "nproc": nproc_from("auto", "processes per pod", gpus),
    }


def classic_pod_line(prog: str, environ: Mapping[str, str]) -> str:
    """The one line a launcher prints in a pod with only the classic variables: which it read."""
    used = ", ".join(f"{name}={environ[name]}" for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))
    return (
        f"{prog}: this pod is node {environ['RANK'].strip()} of {environ['WORLD_SIZE'].strip()}, read from "
        f"{used} (no PET_* variables: Run:ai, or a training-operator before 1.7); flags given win"
    )


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
