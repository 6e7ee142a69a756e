"""TensorBoard: event files in ``RUN_DIR/tensorboard`` through ``torch.utils.tensorboard``.

Resume: the new writer is opened with ``purge_step`` = the checkpoint's step + 1, which writes a
SessionLog START event; TensorBoard's readers then discard every event of the earlier files at that
step or later (what the interrupted attempt logged after its checkpoint), so no step shows twice.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Mapping
from typing import Any

from shoal.tracking.backend import Backend, config_json, flatten
from shoal.tracking.predictions import Predictions

SUBDIR = "tensorboard"

# Event files need none of TensorFlow, but TensorBoard's ``compat.tf`` imports it whenever it is
# installed (``shoal[tensorflow]``): 1.5 s and ~0.5 GB on rank 0, environment variables of its own,
# and a process that then builds a torch optimizer crashes (TF 2.21, torch 2.14). The module
# ``tensorboard.compat.notf`` is TensorBoard's own switch to its TensorFlow stub
# (tensorboard/compat/__init__.py, the ``no_tensorflow`` build target); shoal sets it.
sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))


class TensorBoardBackend(Backend):
    name = "tensorboard"
    modules = ("torch.utils.tensorboard", "torch.utils.tensorboard.summary")
    optional_modules = ("PIL.Image",)  # add_image's

    def open(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = self.options.run_dir / SUBDIR
        purge_step = None
        if self.resume is not None:
            purge_step = 0 if self.resume.step is None else self.resume.step + 1
        self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge_step, flush_secs=10)

    def log_config(self, config: Mapping[str, Any], step: int) -> None:
        from torch.utils.tensorboard.summary import hparams

        self.writer.add_text("config", f"```json\n{config_json(config)}\n```", global_step=step)
        # The HParams dashboard lists runs by their hyperparameters (scalars, strings and bools).
        params = {key: ("" if value is None else value) for key, value in flatten(config).items()}
        for summary in hparams(params, metric_dict={}):
            self.writer.file_writer.add_summary(summary, global_step=step)

    def log_scalars(self, values: Mapping[str, float], step: int, timestamp: float) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, global_step=step, walltime=timestamp)

    def log_predictions(self, name: str, predictions: Predictions, step: int) -> None:
        lines = ["| " + " | ".join(c for c in predictions.columns if c != "image") + " |"]
        lines.append("|" + " --- |" * (len(predictions.columns) - 1))
        for row_id, image, guess, truth, scores in predictions.rows():
            self.writer.add_image(
                f"{name}/{row_id}", image if image.ndim == 3 else image[..., None], global_step=step, dataformats="HWC"
            )
            cells = [str(row_id), str(guess), str(truth), *(f"{score:.4f}" for score in scores)]
            lines.append("| " + " | ".join(cells) + " |")
        self.writer.add_text(name, "\n".join(lines), global_step=step)

    def flush(self) -> None:
        self.writer.flush()

    def state(self) -> dict[str, Any]:
        return {"log_dir": str(self.options.run_dir / SUBDIR)}

    def close(self, failed: bool) -> None:
        self.writer.close()
