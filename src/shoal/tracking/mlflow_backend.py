"""MLflow through ``MlflowClient``, at the given tracking URI, else ``MLFLOW_TRACKING_URI``, else
MLflow's default.

The client API (not ``mlflow.start_run``) leaves MLflow's global active run alone, so a user's own
``mlflow.start_run()`` in the same process is untouched. Resume reopens the same run id (status
back to RUNNING); MLflow cannot delete metric points, so points the interrupted attempt logged
after its checkpoint are kept and the resumed attempt skips a metric's steps up to the last one
the run already holds (values the exact resume reproduces anyway), as W&B does: no step twice.

Each call is a synchronous HTTP request with MLflow's own retries (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``,
``MLFLOW_HTTP_REQUEST_TIMEOUT``); it runs on the tracker's thread, so a slow server never stalls
training, and ``Tracker.close`` stops waiting for it after its timeout.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from shoal.tracking.backend import Backend, flatten
from shoal.tracking.predictions import Predictions

_PARAMS_PER_BATCH = 100  # MLflow's limit per log_batch (mlflow/utils/validation.py)
_PARAM_VALUE_LIMIT = 6000


class MlflowBackend(Backend):
    name = "mlflow"
    modules = ("mlflow", "mlflow.entities", "mlflow.exceptions", "PIL.Image")
    state_needs_open = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run_id: str | None = None
        self.floors: dict[str, int] = {}  # metric -> last step the run already holds (resume)
        self.tables: dict[str, set[str]] = {}  # table name -> artifacts the run already holds

    def open(self) -> None:
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri=self.options.mlflow_uri)
        previous = self.resume.state.get("run_id") if self.resume else None
        if previous and self._reopen(previous):
            return
        experiment_id = self._experiment_id(self.options.project)
        run = self.client.create_run(
            experiment_id, run_name=self.options.run_name, tags={"shoal.run_dir": str(self.options.run_dir)}
        )
        self.run_id = run.info.run_id

    def _reopen(self, run_id: str) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(run_id)
        except MlflowException as err:
            self.say(f"cannot continue run {run_id} ({str(err).splitlines()[0][:200]}): starting a new run")
            return False
        self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id
        for key in run.data.metrics:
            self.floors[key] = max(metric.step for metric in self.client.get_metric_history(run_id, key))
        return True

    def _experiment_id(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        try:
            return self.client.create_experiment(name)
        except MlflowException:  # another job created it in between
            experiment = self.client.get_experiment_by_name(name)
            if experiment is None:
                raise
            return experiment.experiment_id

    def log_config(self, config: Mapping[str, Any], step: int) -> None:
        from mlflow.entities import Param

        # A run's params cannot change (MLflow refuses): a resumed run adds only new ones, and the
        # whole configuration of each attempt is kept as config.json.
        existing = self.client.get_run(self.run_id).data.params
        params = [
            Param(key, str(value)[:_PARAM_VALUE_LIMIT]) for key, value in flatten(config).items() if key not in existing
        ]
        for start in range(0, len(params), _PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[start : start + _PARAMS_PER_BATCH])
        self.client.log_dict(self.run_id, dict(config), "config.json")

    def log_scalars(self, values: Mapping[str, float], step: int, timestamp: float) -> None:
        from mlflow.entities import Metric

        millis = int(timestamp * 1000)
        metrics = [Metric(key, value, millis, step) for key, value in values.items() if step > self.floors.get(key, -1)]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def log_predictions(self, name: str, predictions: Predictions, step: int) -> None:
        from PIL import Image

        artifact = f"{name}/step-{step:09d}.json"
        if name not in self.tables:
            resumed = self.resume is not None
            self.tables[name] = {i.path for i in self.client.list_artifacts(self.run_id, name)} if resumed else set()
        if artifact in self.tables[name]:
            return  # logged by the interrupted attempt (log_table would append the rows again)
        self.tables[name].add(artifact)
        columns: dict[str, list[Any]] = {column: [] for column in predictions.columns}
        for row_id, image, guess, truth, scores in predictions.rows():
            values = [row_id, Image.fromarray(image), guess, truth, *scores]
            for column, value in zip(predictions.columns, values):
                columns[column].append(value)
        self.client.log_table(self.run_id, data=columns, artifact_file=artifact)

    def state(self) -> dict[str, Any]:
        return {"run_id": self.run_id}

    def close(self, failed: bool) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED", end_time=_now_ms())

    def unfinished_hint(self) -> str:
        return f" (run {self.run_id} stays RUNNING in MLflow)" if self.run_id else " (before its run was created)"


def _now_ms() -> int:
    return int(time.time() * 1000)
