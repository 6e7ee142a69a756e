"""shoal: take a PyTorch training job from one device to many machines without a rewrite.

The whole public API::

    import shoal

    ctx = shoal.init(seed=0)                 # whatever launched us: torchrun, srun, mpirun, a pod, python
    model = ctx.wrap(MyNet())                # on ctx.device, in DDP when world_size > 1
    train = ctx.loader(train_set, batch_size=64)      # this rank's shard, reshuffled every epoch
    test = ctx.eval_loader(test_set, batch_size=256)  # exact evaluation, no padding
    ...
    scores = ctx.evaluate(model, test)       # loss/accuracy over the whole test set, all ranks
    ctx.print(scores)                        # rank 0 only
    ctx.shutdown()

Checkpoints and exact resume: ``ckpt = ctx.checkpointer("ckpts", every="200steps")``, then
``ckpt.resume({"model": model, "optimizer": opt, "loader": train})`` before the loop and
``ckpt.maybe_save(epoch=e, step=s, epoch_end=False, objects={...})`` after each step.

The names are loaded on first use (PEP 562), so ``import shoal`` (and every ``shoal --help``)
does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Public name -> the module that defines it.
_EXPORTS = {
    "Checkpoint": "shoal.checkpoint.manager",
    "CheckpointManager": "shoal.checkpoint.manager",
    "Context": "shoal.context",
    "current": "shoal.context",
    "init": "shoal.context",
    "seed_everything": "shoal.context",
    "all_reduce_mean": "shoal.distributed.collectives",
    "barrier": "shoal.distributed.collectives",
    "broadcast_object": "shoal.distributed.collectives",
    "print0": "shoal.distributed.collectives",
    "apply_ddp": "shoal.distributed.wrap",
    "clean_state_dict": "shoal.distributed.wrap",
    "model_state_dict": "shoal.distributed.wrap",
    "unwrap_model": "shoal.distributed.wrap",
    "EnvInfo": "shoal.env",
    "detect_environment": "shoal.env",
    "ShoalError": "shoal.errors",
    "evaluate": "shoal.evaluation",
    "Preempted": "shoal.preemption",
    "TrainResult": "shoal.train.trainer",
    "fit": "shoal.train.job",
    "run": "shoal.train.function",
    "PreemptionWatch": "shoal.preemption",
    "Workload": "shoal.workloads.base",
    "WorkloadData": "shoal.workloads.base",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'shoal' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # what type checkers and IDEs see
    from shoal.checkpoint.manager import Checkpoint, CheckpointManager
    from shoal.context import Context, current, init, seed_everything
    from shoal.distributed.collectives import all_reduce_mean, barrier, broadcast_object, print0
    from shoal.distributed.wrap import apply_ddp, clean_state_dict, model_state_dict, unwrap_model
    from shoal.env import EnvInfo, detect_environment
    from shoal.errors import ShoalError
    from shoal.evaluation import evaluate
    from shoal.preemption import Preempted, PreemptionWatch
    from shoal.train.function import run
    from shoal.train.job import fit
    from shoal.train.trainer import TrainResult
    from shoal.workloads.base import Workload, WorkloadData
