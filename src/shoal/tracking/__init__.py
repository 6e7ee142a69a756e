"""Experiment tracking for shoal jobs and users' own loops: W&B, TensorBoard, MLflow.

::

    from shoal.tracking import create_tracker, reduce_metrics

    tracker = create_tracker("wandb,tensorboard,mlflow", run_dir="runs/a", config=config)  # every rank
    stats = reduce_metrics({"loss": loss.item()}, count=len(batch))                        # every rank
    tracker.log({"train/loss": stats["loss"]}, step=step)                                  # rank 0 logs
    tracker.close()

Only global rank 0 talks to a tracker; the others get one whose methods do nothing. A tracker
never runs a collective, never stalls the loop (each backend works on its own thread) and never
fails the job: a backend that raises is reported once and switched off. See docs/TRACKING.md.

The names load on first use, so ``import shoal.tracking`` imports no tracker library, no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "TRACKERS": "shoal.tracking.spec",
    "parse_spec": "shoal.tracking.spec",
    "Tracker": "shoal.tracking.tracker",
    "create_tracker": "shoal.tracking.tracker",
    "Predictions": "shoal.tracking.predictions",
    "reduce_metrics": "shoal.tracking.reduce",
}

__all__ = ["TRACKERS", "Predictions", "Tracker", "create_tracker", "parse_spec", "reduce_metrics"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'shoal.tracking' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:
    from shoal.tracking.predictions import Predictions
    from shoal.tracking.reduce import reduce_metrics
    from shoal.tracking.spec import TRACKERS, parse_spec
    from shoal.tracking.tracker import Tracker, create_tracker
