"""Reading back what was logged, with each tool's own reader.

- W&B: ``wandb leet inspect --json`` (wandb-core's reader of its own ``.wandb`` transaction log,
  one JSON object per record); the predictions table and its images through the table artifact's
  manifest, as that record lists them.
- TensorBoard: ``EventAccumulator``, which also applies ``purge_step``'s SessionLog like the UI.
- MLflow: ``MlflowClient`` against the test's ``mlflow server``, and ``mlflow.load_table``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

BIN = Path(sys.executable).parent


@dataclass
class WandbRun:
    """One offline run directory, as wandb's reader sees its records."""

    directory: Path
    records: list[dict[str, Any]]
    run: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.run = next(r["run"] for r in self.records if r["type"] == "run")

    @property
    def run_id(self) -> str:
        return self.run["run_id"]

    @property
    def config(self) -> dict[str, Any]:
        """The config as the run logged it (wandb's own ``_wandb`` entry left out)."""
        merged: dict[str, Any] = {}
        for record in self.records:
            update = (record.get("config") or record.get("run", {}).get("config") or {}).get("update") or {}
            merged.update({k: v for k, v in update.items() if k != "_wandb"})
        return merged

    def history(self) -> dict[int, dict[str, Any]]:
        """Step -> the history row (each step once per file)."""
        rows: dict[int, dict[str, Any]] = {}
        for record in self.records:
            if record["type"] == "history":
                item = record["history"]["item"]
                step = int(item["_step"])
                assert step not in rows, f"step {step} twice in {self.directory}"
                rows[step] = item
        return rows

    def series(self, key: str) -> dict[int, float]:
        return {step: row[key] for step, row in self.history().items() if key in row}

    def table(self, key: str, step: int, staging_root: Path) -> tuple[list[str], list[list[Any]], dict[str, Path]]:
        """The logged table at ``step``: columns, rows, and image path -> local file (the artifact's
        manifest, whose files wait in WANDB_DATA_DIR's staging area until ``wandb sync``)."""
        row = self.history()[step]
        assert row[f"{key}._type"] == "table-file"
        artifact_path = row[f"{key}.artifact_path"]  # wandb-client-artifact://<client id>/<name>
        client_id = artifact_path.split("://", 1)[1].split("/", 1)[0]
        artifact = next(
            r["artifact"] for r in self.records if r["type"] == "artifact" and r["artifact"]["client_id"] == client_id
        )
        files = {entry["path"]: Path(entry["local_path"]) for entry in artifact["manifest"]["contents"]}
        for path in files.values():
            assert staging_root in path.parents, path
        table = json.loads(files[f"{key}.table.json"].read_text())
        return table["columns"], table["data"], files


def wandb_runs(run_dir: Path, env: dict[str, str]) -> list[WandbRun]:
    """Every offline run directory under ``run_dir/wandb``, oldest first."""
    runs = []
    for directory in sorted((run_dir / "wandb").glob("offline-run-*")):
        proc = subprocess.run(
            [str(BIN / "wandb"), "leet", "inspect", "--json", str(directory)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs.append(WandbRun(directory, [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]))
    return runs


def png_pixels(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image.convert("L"))


def tensorboard(log_dir: Path):
    # TensorBoard without TensorFlow (installed by shoal[tensorflow]), as shoal's own backend reads it.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import shoal.tracking.tensorboard_backend  # noqa: F401

    accumulator = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


def tb_series(accumulator, tag: str) -> dict[int, float]:
    events = accumulator.Scalars(tag)
    steps = [e.step for e in events]
    assert len(steps) == len(set(steps)), f"{tag}: a step twice: {steps}"
    return {e.step: e.value for e in events}


def mlflow_series(client, run_id: str, key: str) -> dict[int, float]:
    history = client.get_metric_history(run_id, key)
    steps = [m.step for m in history]
    assert len(steps) == len(set(steps)), f"{key}: a step twice: {sorted(steps)}"
    return {m.step: m.value for m in history}
