"""What a training task returns to its workflow: :class:`TrainOutputs`, the tutorial's two outputs."""

# No ``from __future__ import annotations`` here: flytekit reads a NamedTuple's field types from
# ``__annotations__`` as they are, and strings would not do.
from typing import TYPE_CHECKING, NamedTuple

from flytekit.types.file import FlyteFile

if TYPE_CHECKING:
    from shoal.train.trainer import TrainResult


class TrainOutputs(NamedTuple):
    """A Flyte task's named outputs: the test accuracy of every epoch and the trained model.

    ``model_state`` is ``model.pt``: the unwrapped model's plain state dict, which
    ``torch.load(path, weights_only=True)`` reads and ``model.load_state_dict`` takes. The names are
    those of the Flyte tutorial's ``TrainingOutputs``, so a workflow that consumed them is unchanged.
    Ranks other than 0 of an Elastic task return ``model_state=None``: the plugin drops their outputs.
    """

    epoch_accuracies: list[float]
    model_state: FlyteFile


def to_outputs(result: "TrainResult") -> TrainOutputs:
    """A :class:`~shoal.train.trainer.TrainResult` as the task's outputs (global rank 0 has the model)."""
    model = FlyteFile(str(result.model_path)) if result.model_path is not None else None
    return TrainOutputs(epoch_accuracies=epoch_accuracies(result), model_state=model)


def epoch_accuracies(result: "TrainResult") -> list[float]:
    """The test accuracy of every epoch; NaN for a workload that measures none (its own metrics)."""
    return [float("nan") if a is None else float(a) for a in result.accuracies]
