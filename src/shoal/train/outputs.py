"""The run directory: where it is, checking it can be written, and what rank 0 writes into it.

Layout: ``config.json`` (resolved configuration, environment, world size), ``metrics.jsonl`` (one
object per epoch), ``accuracies.json`` (per-epoch test accuracies) and ``model.pt`` (the unwrapped
model's plain state dict). Every file is replaced atomically, so a crash never leaves half a file.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from shoal.checkpoint.storage import atomic_torch_save, atomic_write_text
from shoal.errors import ShoalError

RUN_MARKER = "config.json"


def default_out_dir(workload: str, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return os.path.join("runs", f"{workload}-{stamp}")


def prepare_out_dir(path: str) -> Path:
    """Create ``path`` if needed and check it can be written; refuse to clobber a finished run."""
    out = Path(path).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".shoal-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ShoalError(
            f"output directory {out} is not writable: {err.strerror or err}",
            "pass --out DIR with a directory you can write to",
        ) from None
    if (out / RUN_MARKER).exists():
        raise ShoalError(
            f"output directory {out} already holds a run ({RUN_MARKER} exists); it was left untouched",
            "pass a new --out DIR, or delete the old run first",
        )
    return out


class RunOutputs:
    """Rank 0's writer for the run directory."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.accuracies: list[float] = []

    def write_config(self, config: dict[str, Any]) -> None:
        atomic_write_text(self.directory / RUN_MARKER, json.dumps(config, indent=2, sort_keys=True, default=str) + "\n")

    def log_epoch(self, record: dict[str, Any]) -> None:
        # Appending one line is atomic enough for a log: a torn last line is the only possible damage.
        with open(self.directory / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.accuracies.append(record["test_accuracy"])
        atomic_write_text(self.directory / "accuracies.json", json.dumps(self.accuracies) + "\n")

    def save_model(self, state_dict: dict[str, Any]) -> Path:
        return atomic_torch_save(state_dict, self.directory / "model.pt")
