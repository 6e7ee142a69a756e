"""What every tracker backend implements, and the run options they share.

A backend is made on the caller's thread (cheap: no import of its library) and then used only from
its own worker thread (:mod:`shoal.tracking.sink`), which calls ``open`` first. Its methods may
raise anything: the sink reports the first error and disables the backend.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from shoal.tracking.predictions import Predictions


@dataclass(frozen=True)
class RunOptions:
    """What identifies the run in every tool (see :func:`shoal.tracking.create_tracker`)."""

    run_dir: Path
    project: str
    run_name: str
    mlflow_uri: str | None = None
    init_timeout: float = 30.0
    """Seconds W&B may take to open an online run before shoal falls back to offline."""
    flush_timeout: float = 10.0
    """Seconds a flush may wait for a tracker to write what was logged (W&B's transaction log):
    the tracker's ``state_timeout``, so a checkpoint's flush and its wait end together."""


@dataclass(frozen=True)
class Resume:
    """What a previous attempt left (from :meth:`Tracker.state_dict`): this backend's part of it,
    and the last step logged before that state was taken."""

    step: int | None
    state: Mapping[str, Any]


class Backend:
    name: ClassVar[str] = ""
    modules: ClassVar[tuple[str, ...]] = ()
    """What the backend imports; :meth:`load` imports it on the caller's thread (see there)."""
    optional_modules: ClassVar[tuple[str, ...]] = ()
    """What the backend's library imports lazily for some calls (PIL for images), imported by
    :meth:`load` too when installed (see there)."""
    state_needs_open: ClassVar[bool] = False
    """Whether :meth:`state` knows the run only once ``open`` has returned (an id the server picks)."""

    def __init__(self, options: RunOptions, resume: Resume | None, say: Callable[[str], None]) -> None:
        self.options = options
        self.resume = resume
        self.say = say  # one line to the user, prefixed with the tracker's name

    @classmethod
    def load(cls) -> None:
        """Import the library now, on the caller's thread: import errors surface at once, and a
        script that ends right after logging does not leave the import to a thread racing the
        interpreter's shutdown (imports that register exit hooks fail then).

        The optional modules too: two backends' threads importing PIL at once (W&B's and
        TensorBoard's first image) can meet in importlib's deadlock detection, which hands one of
        them the partly initialised module ("partially initialized module 'PIL.Image' has no
        attribute 'Image'"), and that backend is switched off."""
        for module in cls.modules:
            importlib.import_module(module)
        for module in cls.optional_modules:
            try:
                importlib.import_module(module)
            except ImportError:  # the calls that need it fail on the backend's thread, reported there
                pass

    def open(self) -> None:
        """Open (or reopen, when resuming) the run."""
        raise NotImplementedError

    def log_config(self, config: Mapping[str, Any], step: int) -> None:
        raise NotImplementedError

    def log_scalars(self, values: Mapping[str, float], step: int, timestamp: float) -> None:
        """Numbers at ``step``; ``timestamp`` (seconds since the epoch) is when the caller logged them."""
        raise NotImplementedError

    def log_predictions(self, name: str, predictions: Predictions, step: int) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        """Make what was logged so far durable (or sent)."""

    def state(self) -> dict[str, Any]:
        """What a resumed job needs to continue this run (plain values: saved in a checkpoint)."""
        return {}

    def close(self, failed: bool) -> None:
        raise NotImplementedError

    def unfinished_hint(self) -> str:
        """Said after a close that timed out: where the data is and how to finish the job by hand."""
        return ""


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; values that are not str/int/float/bool become text."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, prefix=f"{name}."))
        elif value is None or isinstance(value, (str, int, float, bool)):
            flat[name] = value
        else:
            flat[name] = json.dumps(value, default=str)
    return flat


def config_json(config: Mapping[str, Any]) -> str:
    return json.dumps(config, indent=2, sort_keys=True, default=str)
