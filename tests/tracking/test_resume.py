"""A job killed after its checkpoint and resumed from it continues the same run in every tool.

Attempt 1 logs steps 1..6, saves the tracker's state with a real shoal checkpoint at step 4 (the end
of epoch 1), logs steps 5 and 6 with values that differ from what attempt 2 will log there (so the
readers show which attempt's values a tool kept), and is SIGKILLed. Attempt 2 loads the checkpoint
and logs steps 5..12.
"""

from __future__ import annotations

import signal

import pytest
from mlflow import MlflowClient

from tracking.harness import run_job, tool_environment
from tracking.readers import mlflow_series, tb_series, tensorboard, wandb_runs
from tracking.scripts.tracked_job import expected_epoch, expected_loss

pytestmark = (
    pytest.mark.slow
)  # two training attempts, one SIGKILLed, beside an MLflow server: make test, not test-quick

SAVED_AT, KILLED_AFTER, LAST = 4, 6, 12
OFFSET = 100.0  # what attempt 1 adds to its losses after the checkpoint


def loss(step: int) -> float:
    return expected_loss(step, world_size=1)


@pytest.fixture(scope="module")
def resumed_job(tmp_path_factory, mlflow_server):
    root = tmp_path_factory.mktemp("resume")
    env = tool_environment(root / "home")
    common = {
        "spec": "wandb,tensorboard,mlflow",
        "run_dir": str(root / "run"),
        "project": "resume",
        "mlflow_uri": mlflow_server,
        "epoch_steps": 4,
        "checkpoint_dir": str(root / "run" / "checkpoints"),
    }
    first = {**common, "first_step": 1, "last_step": LAST, "save_at": SAVED_AT, "kill_after": KILLED_AFTER}
    first["offset_after_save"] = OFFSET
    proc, results = run_job(first, root / "results-1", env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert "loop finished" not in proc.stdout and not results
    client = MlflowClient(tracking_uri=mlflow_server)
    (killed,) = client.search_runs([client.get_experiment_by_name("resume").experiment_id])
    assert killed.info.status == "RUNNING"  # nobody ended it

    proc, results = run_job(
        {**common, "first_step": SAVED_AT + 1, "last_step": LAST, "resume": True}, root / "results-2", env
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return {"root": root, "run_dir": root / "run", "env": env, "state": results[0]["state"], "killed": killed}


def test_tensorboard_purges_what_the_killed_attempt_logged_after_its_checkpoint(resumed_job):
    log_dir = resumed_job["run_dir"] / "tensorboard"
    assert len(list(log_dir.glob("events.out.tfevents.*"))) == 2  # one file per attempt, one run
    board = tensorboard(log_dir)
    # Every step once; steps 5 and 6 carry attempt 2's values: attempt 1's were purged.
    assert tb_series(board, "train/loss") == pytest.approx({s: loss(s) for s in range(1, LAST + 1)})
    assert tb_series(board, "epoch") == {4: 1, 8: 2, 12: 3}


def test_mlflow_continues_the_same_run_without_a_step_twice(resumed_job, mlflow_server):
    client = MlflowClient(tracking_uri=mlflow_server)
    runs = client.search_runs([client.get_experiment_by_name("resume").experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_id == resumed_job["killed"].info.run_id == resumed_job["state"]["trackers"]["mlflow"]["run_id"]
    assert run.info.status == "FINISHED"
    # MLflow cannot delete points: steps 5 and 6 keep attempt 1's values, logged once.
    expected = {s: loss(s) + (OFFSET if SAVED_AT < s <= KILLED_AFTER else 0.0) for s in range(1, LAST + 1)}
    assert mlflow_series(client, run.info.run_id, "train/loss") == pytest.approx(expected)
    epochs = mlflow_series(client, run.info.run_id, "epoch/train_loss")
    assert epochs == pytest.approx({4 * e: expected_epoch(e)["train_loss"] for e in (1, 2, 3)})
    tables = sorted(info.path for info in client.list_artifacts(run.info.run_id, "predictions"))
    assert tables == [f"predictions/step-{s:09d}.json" for s in (4, 8, 12)]


def test_wandb_reopens_the_same_run_id(resumed_job):
    runs = wandb_runs(resumed_job["run_dir"], resumed_job["env"])
    assert len(runs) == 2  # one offline directory per attempt; `wandb sync` replays both into one run
    first, second = runs
    assert first.run_id == second.run_id == resumed_job["state"]["trackers"]["wandb"]["run_id"]
    assert second.run.get("resume") is True
    assert first.series("train/loss") == pytest.approx(
        {s: loss(s) + (OFFSET if s > SAVED_AT else 0.0) for s in range(1, KILLED_AFTER + 1)}
    )
    assert second.series("train/loss") == pytest.approx({s: loss(s) for s in range(SAVED_AT + 1, LAST + 1)})
    # Together: every step, each file in increasing steps. W&B keeps only increasing steps when
    # the files are replayed in order, so steps 5-6 keep the first attempt's values, as in MLflow.
    assert set(first.history()) | set(second.history()) == set(range(1, LAST + 1))
