"""Flyte tasks that train with shoal (``pip install 'shoal[flyte]'``); see docs/FLYTE.md.

::

    from flytekit import workflow
    from shoal.flyte import TrainOutputs, fit, train_task

    @train_task(nproc=2, retries=2, cache=True, cache_version="1")   # 2 workers, 2 GPUs requested
    def train(epochs: int) -> TrainOutputs:
        return fit("mnist", epochs=epochs, data="/data", tracker="wandb")

The modules, by concept:

- :mod:`~.task`: :func:`train_task` (``flytekit.task`` with one GPU per worker), :func:`fit` (``shoal.fit``
  as a task's body: sandboxed run directory, resume through Flyte's checkpoint, retryable failures,
  also as one rank of a kfpytorch ``Elastic`` task) and :func:`resources`.
- :mod:`~.mirror`: :class:`CheckpointMirror`, Flyte's intra-task checkpoint kept as a copy of the run's
  checkpoints, so that a retried attempt resumes instead of starting over.
- :mod:`~.outputs`: :class:`TrainOutputs` (``epoch_accuracies``, ``model_state``), the tutorial's outputs.
"""

from __future__ import annotations

from shoal.errors import ShoalError

try:
    import flytekit  # noqa: F401
except ImportError:  # pragma: no cover - the extra is installed wherever this module is used
    raise ShoalError("shoal.flyte needs flytekit, which is not installed", "pip install 'shoal[flyte]'") from None

from shoal.flyte.mirror import CheckpointMirror
from shoal.flyte.outputs import TrainOutputs
from shoal.flyte.task import fit, resources, train_task

__all__ = ["CheckpointMirror", "TrainOutputs", "fit", "resources", "train_task"]
