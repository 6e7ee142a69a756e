"""Which trackers exist, parsing ``--tracker wandb,tensorboard,mlflow``, and checking their packages.

Stdlib only: the CLI reads :data:`TRACKERS` for its help text without importing any tracker.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass

from shoal.errors import ShoalError


@dataclass(frozen=True)
class TrackerKind:
    name: str
    package: str
    """The top-level package the backend imports (looked up, not imported, on every rank)."""
    extra: str
    """The ``shoal[...]`` extra that installs it."""
    summary: str


TRACKERS: dict[str, TrackerKind] = {
    kind.name: kind
    for kind in (
        TrackerKind("wandb", "wandb", "wandb", "Weights & Biases (offline when no API key is configured)"),
        TrackerKind("tensorboard", "tensorboard", "tensorboard", "TensorBoard event files in RUN_DIR/tensorboard"),
        TrackerKind("mlflow", "mlflow", "mlflow", "MLflow, at MLFLOW_TRACKING_URI or the given tracking URI"),
    )
}
"""The trackers shoal can log to, in the order they are listed in help texts."""


def parse_spec(spec: str | Iterable[str] | None) -> tuple[str, ...]:
    """``"wandb,tensorboard"`` (or a list of names) as a tuple of known names, duplicates dropped.

    None, ``""`` and ``"none"`` mean no tracker. An unknown name is a :class:`ShoalError` that
    lists the choices.
    """
    if spec is None:
        return ()
    parts = spec.split(",") if isinstance(spec, str) else list(spec)
    names: list[str] = []
    for part in parts:
        name = part.strip().lower()
        if not name or name == "none":
            continue
        if name not in TRACKERS:
            raise ShoalError(
                f"unknown tracker {part.strip()!r}; the trackers are {', '.join(TRACKERS)}",
                "pass --tracker with a comma-separated subset, e.g. --tracker wandb,tensorboard",
            )
        if name not in names:
            names.append(name)
    return tuple(names)


def require_installed(names: Iterable[str]) -> None:
    """A :class:`ShoalError` with the pip command for the first tracker whose package is missing.

    The package is looked up (``importlib.util.find_spec``), not imported, so every rank can run
    this check and fail the same way, while only rank 0 ever imports a tracker library.
    """
    for name in names:
        kind = TRACKERS[name]
        try:
            found = importlib.util.find_spec(kind.package) is not None
        except (ImportError, ValueError):  # a finder refused it, or a half-removed package
            found = False
        if not found:
            raise ShoalError(
                f"the {name} tracker needs the {kind.package} package, which is not installed",
                f"pip install 'shoal[{kind.extra}]' (or drop {name} from --tracker)",
            )
