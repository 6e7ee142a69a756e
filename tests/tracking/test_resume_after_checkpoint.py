"""A job SIGKILLed right after a checkpoint (no flush, no grace) and resumed from it: every tool's
history holds every epoch exactly once, because what the checkpoint records was written before the
checkpoint was (the tracker's ``state_dict()`` makes every sink durable first).

Attempt 1 logs epochs 1-4 (2 steps each), checkpoints at the end of epoch 4 and kills itself at once;
attempt 2 resumes from that checkpoint and logs epochs 5-6.
"""

from __future__ import annotations

import signal

import pytest
from mlflow import MlflowClient

from tracking.harness import run_job, tool_environment
from tracking.readers import mlflow_series, tb_series, tensorboard, wandb_runs
from tracking.scripts.tracked_job import expected_epoch, expected_loss

EPOCH_STEPS, SAVED_AT_EPOCH, LAST_EPOCH = 2, 4, 6
SAVED_AT, LAST = SAVED_AT_EPOCH * EPOCH_STEPS, LAST_EPOCH * EPOCH_STEPS
ACCURACY = {e * EPOCH_STEPS: expected_epoch(e)["test_accuracy"] for e in range(1, LAST_EPOCH + 1)}


@pytest.fixture(scope="module")
def killed_after_checkpoint(tmp_path_factory, mlflow_server):
    root = tmp_path_factory.mktemp("killed-after-checkpoint")
    env = tool_environment(root / "home")
    common = {
        "spec": "wandb,tensorboard,mlflow",
        "run_dir": str(root / "run"),
        "project": "killed-after-checkpoint",
        "mlflow_uri": mlflow_server,
        "epoch_steps": EPOCH_STEPS,
        "checkpoint_dir": str(root / "run" / "checkpoints"),
    }
    first = {**common, "first_step": 1, "last_step": LAST, "save_at": SAVED_AT, "kill_after_save": True}
    proc, results = run_job(first, root / "results-1", env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert not results and len(list((root / "run" / "checkpoints").glob("ckpt-*.pt"))) == 1
    proc, results = run_job(
        {**common, "first_step": SAVED_AT + 1, "last_step": LAST, "resume": True}, root / "results-2", env
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return {"run_dir": root / "run", "env": env, "state": results[0]["state"]}


@pytest.mark.slow  # the fixture's two attempts: make test, not test-quick
def test_tensorboard_has_every_epoch_once(killed_after_checkpoint):
    board = tensorboard(killed_after_checkpoint["run_dir"] / "tensorboard")
    assert tb_series(board, "epoch/test_accuracy") == pytest.approx(ACCURACY)
    losses = tb_series(board, "train/loss")
    assert losses == pytest.approx({s: expected_loss(s, world_size=1) for s in range(1, LAST + 1)})


@pytest.mark.slow  # the fixture's two attempts: make test, not test-quick
def test_mlflow_has_every_epoch_once(killed_after_checkpoint, mlflow_server):
    client = MlflowClient(tracking_uri=mlflow_server)
    (run,) = client.search_runs([client.get_experiment_by_name("killed-after-checkpoint").experiment_id])
    assert run.info.run_id == killed_after_checkpoint["state"]["trackers"]["mlflow"]["run_id"]
    assert mlflow_series(client, run.info.run_id, "epoch/test_accuracy") == pytest.approx(ACCURACY)
    tables = sorted(info.path for info in client.list_artifacts(run.info.run_id, "predictions"))
    assert tables == [f"predictions/step-{s:09d}.json" for s in sorted(ACCURACY)]


@pytest.mark.slow  # the fixture's two attempts: make test, not test-quick
def test_wandb_has_every_epoch_once(killed_after_checkpoint):
    first, second = wandb_runs(killed_after_checkpoint["run_dir"], killed_after_checkpoint["env"])
    assert first.run_id == second.run_id
    before, after = first.series("epoch/test_accuracy"), second.series("epoch/test_accuracy")
    assert before == pytest.approx({s: a for s, a in ACCURACY.items() if s <= SAVED_AT}), (
        f"the killed attempt's W&B file lacks what its checkpoint recorded: steps {sorted(first.history())}"
    )
    assert after == pytest.approx({s: a for s, a in ACCURACY.items() if s > SAVED_AT})


def test_wandb_alone_has_written_what_its_checkpoint_counts(tmp_path):
    # With MLflow beside it (the flush waits for a server) or tables (artifacts written), W&B's
    # writer catches up meanwhile; numbers alone, the kill comes milliseconds after the commit.
    env = tool_environment(tmp_path / "home")
    plan = {
        "spec": "wandb",
        "run_dir": str(tmp_path / "run"),
        "epoch_steps": EPOCH_STEPS,
        "checkpoint_dir": str(tmp_path / "run" / "checkpoints"),
        "first_step": 1,
        "last_step": LAST,
        "save_at": SAVED_AT,
        "kill_after_save": True,
        "predictions": False,
    }
    proc, _ = run_job(plan, tmp_path / "results", env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    (killed,) = wandb_runs(tmp_path / "run", env)
    assert sorted(killed.history()) == list(range(1, SAVED_AT + 1)), proc.stderr[-2000:]
    assert killed.series("epoch/test_accuracy") == pytest.approx({s: a for s, a in ACCURACY.items() if s <= SAVED_AT})


def test_the_transaction_log_reader_agrees_with_wandb_across_blocks(tmp_path):
    from shoal.tracking.wandb_backend import TransactionLogTail

    env = tool_environment(tmp_path / "home")
    last = 1500  # about 400 KiB: records cross many 32 KiB blocks
    plan = {"spec": "wandb", "run_dir": str(tmp_path / "run"), "epoch_steps": 500, "predictions": False}
    proc, _ = run_job({**plan, "first_step": 1, "last_step": last}, tmp_path / "results", env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = wandb_runs(tmp_path / "run", env)
    (log,) = run.directory.glob("run-*.wandb")
    assert log.stat().st_size > 10 * TransactionLogTail.BLOCK
    tail = TransactionLogTail(str(log))
    assert tail.last_step() == max(run.history()) == last
    assert tail.offset == log.stat().st_size  # every record read, none cut
    assert tail.last_step() == last  # read again from where it stopped: nothing new, same answer
