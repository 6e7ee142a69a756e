"""The run directory: where it is, checking it can be written, and what rank 0 writes into it.

Layout: ``config.json`` (resolved configuration, environment, world size), ``metrics.jsonl`` (one
object per epoch), ``accuracies.json`` (per-epoch test accuracies), ``model.pt`` (the unwrapped
model's plain state dict, written at the end) and ``checkpoints/``. Every file but the append-only
metrics log is replaced atomically, so a crash never leaves half a file.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from shoal.atomic import atomic_write_text
from shoal.checkpoint.storage import atomic_torch_save
from shoal.errors import ShoalError

CONFIG = "config.json"
METRICS = "metrics.jsonl"
ACCURACIES = "accuracies.json"
MODEL = "model.pt"


def default_out_dir(workload: str, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return os.path.join("runs", f"{workload}-{stamp}")


def prepare_out_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` if needed and check that it can be written."""
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
    return out


def refuse_existing_run(out: Path, why: str) -> None:
    raise ShoalError(
        f"output directory {out} already holds a {why} run; it was left untouched",
        "pass a new --out DIR, or delete the old run first",
    )


class RunOutputs:
    """Rank 0's writer for the run directory."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.accuracies: list[float] = []

    @property
    def started(self) -> bool:
        return (self.directory / CONFIG).exists()

    @property
    def model_path(self) -> Path:
        return self.directory / MODEL

    @property
    def finished(self) -> bool:
        return self.model_path.exists()

    def write_config(self, config: dict[str, Any]) -> None:
        atomic_write_text(self.directory / CONFIG, json.dumps(config, indent=2, sort_keys=True, default=str) + "\n")

    def logged_epochs(self) -> list[dict[str, Any]]:
        """The epoch records in metrics.jsonl (a torn last line from a crash is skipped)."""
        records = []
        path = self.directory / METRICS
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return records

    def keep_epochs(self, last_epoch: int) -> None:
        """On resume: keep the metrics of epochs up to ``last_epoch``; later ones will be redone."""
        records = [r for r in self.logged_epochs() if r.get("epoch", 0) <= last_epoch]
        atomic_write_text(self.directory / METRICS, "".join(json.dumps(r) + "\n" for r in records))
        self.accuracies = [r.get("test_accuracy") for r in records]
        atomic_write_text(self.directory / ACCURACIES, json.dumps(self.accuracies) + "\n")

    def log_epoch(self, record: dict[str, Any]) -> None:
        # Appending one line is atomic enough for a log: a torn last line is the only possible
        # damage, and keep_epochs() drops it on resume.
        with open(self.directory / METRICS, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.accuracies.append(record.get("test_accuracy"))
        atomic_write_text(self.directory / ACCURACIES, json.dumps(self.accuracies) + "\n")

    def save_model(self, state_dict: dict[str, Any]) -> Path:
        return atomic_torch_save(state_dict, self.model_path)
