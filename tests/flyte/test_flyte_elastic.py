"""shoal inside flytekitplugins-kfpytorch's ``Elastic`` task (examples/flyte_workflow.py's
``elastic_workflow``): the plugin's torch elastic agent starts 2 local workers, each runs the task's
body, and ``fit`` trains as that rank of the job (it is not a launcher there), with W&B from rank 0."""

from __future__ import annotations

import json

import pytest
from flyte_harness import (
    digits_test_accuracy,
    flyte_environment,
    load_digits_model,
    metrics,
    printed_outputs,
    pyflyte_run,
    run_dirs,
)

from tracking.readers import wandb_runs

pytestmark = pytest.mark.multiprocess


def test_the_elastic_task_trains_as_two_ranks_started_by_the_plugin(tmp_path):
    env = flyte_environment(tmp_path)
    proc = pyflyte_run(env, tmp_path, "elastic_workflow", "--epochs", "2", "--tracker", "wandb")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run,) = run_dirs(proc.stdout)  # one rank 0, whose run directory rank 1 was told through the agent's store
    records = metrics(run)
    accuracies, model_path = printed_outputs(proc.stdout)
    assert accuracies == [r["test_accuracy"] for r in records] and [r["world_size"] for r in records] == [2, 2]
    assert [r["samples_seen"] for r in records] == [1440, 1440]
    config = json.loads((run / "config.json").read_text())
    assert config["extra"]["environment"] == "torchrun"  # a rank torch's agent started (TORCHELASTIC_RUN_ID)
    assert "start_method" not in config["extra"] and "workers started by" not in proc.stdout  # not shoal's launcher
    assert digits_test_accuracy(load_digits_model(model_path)) == pytest.approx(accuracies[-1], abs=1e-12)
    # Rank 0 copied its checkpoints to the task's Flyte checkpoint (locally: the sandbox's __cp).
    kept = sorted(p.name for p in (run / "checkpoints").glob("ckpt-*.pt"))
    assert len(kept) == 2 and sorted(p.name for p in (run.parent / "__cp").glob("ckpt-*.pt")) == kept
    (wandb_run,) = wandb_runs(run, env)  # W&B offline (no key), one run: rank 1 created none
    assert wandb_run.config["extra"]["world_size"] == 2
    assert list(wandb_run.series("epoch/test_accuracy").values()) == pytest.approx(accuracies)
