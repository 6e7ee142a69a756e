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
"""

__version__ = "0.1.0"

from shoal.checkpoint.manager import Checkpoint, CheckpointManager
from shoal.dist.collectives import all_reduce_mean, barrier, broadcast_object, print0
from shoal.dist.context import Context, current, init, seed_everything
from shoal.dist.wrap import apply_ddp, clean_state_dict, model_state_dict, unwrap_model
from shoal.env import EnvInfo, detect_environment
from shoal.errors import ShoalError
from shoal.train.evaluate import evaluate
from shoal.train.preemption import Preempted, PreemptionWatch

__all__ = [
    "Checkpoint",
    "CheckpointManager",
    "Context",
    "EnvInfo",
    "Preempted",
    "PreemptionWatch",
    "ShoalError",
    "__version__",
    "all_reduce_mean",
    "apply_ddp",
    "barrier",
    "broadcast_object",
    "clean_state_dict",
    "current",
    "detect_environment",
    "evaluate",
    "init",
    "model_state_dict",
    "print0",
    "seed_everything",
    "unwrap_model",
]
