"""One process per pod: Kubeflow PyTorchJob, Run:ai, and any hand-set ``env://`` variables.

Kubeflow's training operator gives every pod of a PyTorchJob MASTER_ADDR, MASTER_PORT, RANK (the
pod's index, master first) and WORLD_SIZE, but no LOCAL_RANK; Run:ai's distributed PyTorch jobs do
the same. Matches when those four are set and LOCAL_RANK is not (with LOCAL_RANK it is torchrun's).
Every pod then runs one process: local rank 0 of 1, node rank = rank, nodes = world size. That is
this process's place when the pod's command is the training script itself; a launcher in such a pod
(``shoal run``, ``shoal train``) reads the same variables as node RANK of WORLD_SIZE nodes and starts
the pod's workers (:func:`shoal.env.operator.classic_pod`), which then match the torchrun scheme.

Newer operators and Kubeflow Trainer also export torchrun's own settings as PET_* variables
(PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT, PET_NPROC_PER_NODE), which torchrun
reads as defaults for its flags. When the pod's command is torchrun, its workers match the torchrun
scheme first. When it is plain ``python`` and only PET_* are set, this scheme matches on
PET_NODE_RANK, PET_NNODES, PET_MASTER_ADDR and PET_MASTER_PORT and reads the same quantities from
them. Either way, PET_NPROC_PER_NODE > 1 means the job expects torchrun to start several processes
per pod (and counts them in WORLD_SIZE), so a lone python process is an error, not a silent hang.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shoal.env.base import (
    EnvInfo,
    LaunchEnvironment,
    has_all,
    read_port,
    read_rank,
    require,
    seen,
)
from shoal.errors import ShoalError

_CLASSIC = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
_PET = ("PET_NODE_RANK", "PET_NNODES", "PET_MASTER_ADDR", "PET_MASTER_PORT")
_HINT = "set the PyTorchJob's MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE (the training operator does)"


class KubeflowEnvironment(LaunchEnvironment):
    name = "kubeflow"

    @classmethod
    def detect(cls, environ: Mapping[str, str], *, argv: Sequence[str] | None = None) -> bool:
        if "LOCAL_RANK" in environ:
            return False
        return has_all(environ, *_CLASSIC) or (has_all(environ, *_PET) and "RANK" not in environ)

    @classmethod
    def describe(cls, environ: Mapping[str, str], *, argv: Sequence[str] | None = None) -> EnvInfo:
        names = _CLASSIC if has_all(environ, *_CLASSIC) or not has_all(environ, *_PET) else _PET
        require(environ, cls.name, *names, hint=_HINT)
        address_name, port_name, rank_name, world_name = (
            names if names is _CLASSIC else ("PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NODE_RANK", "PET_NNODES")
        )
        if names is _PET and not environ[world_name].strip().isdigit():
            raise ShoalError(
                f"PET_NNODES={environ[world_name]!r} is an elastic range, which only torchrun can resolve",
                "make the container command `torchrun ... train.py` (it reads the PET_* variables), or `shoal run`",
            )
        _check_one_process_per_pod(environ)
        rank, world = read_rank(environ, rank_name, world_name)
        return EnvInfo(
            scheme=cls.name, rank=rank, local_rank=0, world_size=world, local_world_size=1, node_rank=rank,
            num_nodes=world, main_address=environ[address_name], main_port=read_port(environ, port_name),
            reason=seen(environ, *names, "PET_NPROC_PER_NODE"),
        )  # fmt: skip


def _check_one_process_per_pod(environ: Mapping[str, str]) -> None:
    nproc = environ.get("PET_NPROC_PER_NODE", "").strip()
    if nproc.isdigit() and int(nproc) > 1:
        raise ShoalError(
            f"PET_NPROC_PER_NODE={nproc}: the job expects {nproc} processes per pod, but this one was not "
            "started by torchrun",
            "make the container command `torchrun ... train.py` (or `shoal run`), or set nprocPerNode: 1",
        )
