"""A 2-process gloo job logs through all three trackers: one run per tool, everything read back
with the tool's own reader (config, scalars at their steps, per-epoch records, predictions)."""

from __future__ import annotations

import os
from unittest import mock

import numpy as np
import pytest
from mlflow import MlflowClient

from tracking.harness import run_job, tool_environment
from tracking.readers import mlflow_series, png_pixels, tb_series, tensorboard, wandb_runs
from tracking.scripts.tracked_job import CONFIG, expected_epoch, expected_loss, expected_predictions

STEPS = range(1, 9)
EPOCH_STEPS = 4


@pytest.fixture(scope="module")
def two_process_job(tmp_path_factory, mlflow_server):
    """Run the job once under torchrun with 2 processes; the tests below read what it logged."""
    root = tmp_path_factory.mktemp("two-process")
    env = tool_environment(root / "home")
    plan = {
        "spec": "wandb,tensorboard,mlflow",
        "run_dir": str(root / "run"),
        "project": "two-process",
        "run_name": "job-a",
        "mlflow_uri": mlflow_server,
        "first_step": STEPS[0],
        "last_step": STEPS[-1],
        "epoch_steps": EPOCH_STEPS,
    }
    proc, results = run_job(plan, root / "results", env, nproc=2, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert sorted(results) == [0, 1]
    return {"root": root, "run_dir": root / "run", "env": env, "proc": proc, "results": results}


@pytest.mark.multiprocess
def test_rank_1_imports_no_tracker_and_the_numbers_are_exact(two_process_job):
    results = two_process_job["results"]
    assert results[1]["modules"] == []  # rank 1 never imported wandb, mlflow or tensorboard
    assert {"wandb", "mlflow", "torch.utils.tensorboard"} <= set(results[0]["modules"])
    for rank in (0, 1):  # one all-reduce gave every rank the weighted mean, not a mean of means
        for step, reduced in results[rank]["reduced"].items():
            assert reduced["loss"] == pytest.approx(expected_loss(int(step), world_size=2), rel=1e-12)
            assert reduced["seen"] == 1 + 3  # summed, not averaged
    stderr = two_process_job["proc"].stderr
    assert stderr.count("shoal: tracker wandb: no W&B API key configured: logging offline") == 1
    assert f"wandb sync {two_process_job['run_dir'] / 'wandb'}" in stderr


@pytest.mark.multiprocess
def test_wandb_one_offline_run_with_everything(two_process_job):
    run_dir, env = two_process_job["run_dir"], two_process_job["env"]
    runs = wandb_runs(run_dir, env)
    assert len(runs) == 1  # one run for the job: rank 1 created none
    run = runs[0]
    assert run.run_id == two_process_job["results"][0]["state"]["trackers"]["wandb"]["run_id"]
    assert run.run["project"] == "two-process" and run.run["display_name"] == "job-a"
    assert run.config == CONFIG
    assert run.series("train/loss") == pytest.approx({s: expected_loss(s, 2) for s in STEPS})
    epoch_steps = [s for s in STEPS if s % EPOCH_STEPS == 0]
    for step in epoch_steps:
        record = expected_epoch(step // EPOCH_STEPS)
        row = run.history()[step]
        assert row["epoch"] == record["epoch"]
        assert row["epoch/train_loss"] == pytest.approx(record["train_loss"])
        assert row["epoch/test_accuracy"] == pytest.approx(record["test_accuracy"])
        _check_wandb_table(run, step, two_process_job["root"] / "home" / "wandb-data")
    assert any(r["type"] == "exit" and r["exit"].get("exit_code", 0) == 0 for r in run.records)


def _check_wandb_table(run, step, staging_root):
    expected = expected_predictions(step)
    columns, rows, files = run.table("predictions", step, staging_root)
    assert columns == ["id", "image", "guess", "truth", "score_0", "score_1", "score_2"]
    assert len(rows) == len(expected)
    for row, (row_id, image, guess, truth, scores) in zip(rows, expected.rows()):
        assert row[0] == row_id and row[2] == guess and row[3] == truth
        assert row[4:] == pytest.approx(scores)
        assert row[1]["_type"] == "image-file"
        np.testing.assert_array_equal(png_pixels(files[row[1]["path"]]), image)


@pytest.mark.multiprocess
def test_tensorboard_one_event_file_with_everything(two_process_job):
    log_dir = two_process_job["run_dir"] / "tensorboard"
    assert len(list(log_dir.glob("events.out.tfevents.*"))) == 1  # rank 1 wrote none
    board = tensorboard(log_dir)
    assert tb_series(board, "train/loss") == pytest.approx({s: expected_loss(s, 2) for s in STEPS})
    assert set(tb_series(board, "train/lr")) == set(STEPS)
    epochs = tb_series(board, "epoch/test_accuracy")
    assert epochs == pytest.approx({4: expected_epoch(1)["test_accuracy"], 8: expected_epoch(2)["test_accuracy"]})
    assert tb_series(board, "epoch") == {4: 1, 8: 2}
    config_text = board.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert '"width": 128' in config_text and '"lr": 0.1' in config_text
    assert "_hparams_/experiment" in board.PluginTagToContent("hparams")
    for step in (4, 8):
        expected = expected_predictions(step)
        for row_id, image, *_ in expected.rows():
            (event,) = [e for e in board.Images(f"predictions/{row_id}") if e.step == step]
            np.testing.assert_array_equal(_decode_png(event.encoded_image_string), image)
        table = [
            e.tensor_proto.string_val[0].decode() for e in board.Tensors("predictions/text_summary") if e.step == step
        ]
        assert len(table) == 1
        for row_id, _, guess, truth, scores in expected.rows():
            assert f"| {row_id} | {guess} | {truth} | {scores[0]:.4f} |" in table[0]


def _decode_png(data: bytes) -> np.ndarray:
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("L"))


@pytest.mark.multiprocess
def test_mlflow_one_run_with_everything(two_process_job, mlflow_server):
    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name("two-process")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1  # rank 1 created no run
    run = runs[0]
    assert run.info.run_id == two_process_job["results"][0]["state"]["trackers"]["mlflow"]["run_id"]
    assert run.info.run_name == "job-a" and run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.1", "optimizer": "sgd", "model.width": "128", "model.depth": "3"}
    assert mlflow_series(client, run.info.run_id, "train/loss") == pytest.approx(
        {s: expected_loss(s, 2) for s in STEPS}
    )
    assert mlflow_series(client, run.info.run_id, "epoch/train_loss") == pytest.approx(
        {4: expected_epoch(1)["train_loss"], 8: expected_epoch(2)["train_loss"]}
    )
    for step in (4, 8):
        expected = expected_predictions(step)
        artifact = f"predictions/step-{step:09d}.json"
        # load_table searches through MLflow's global tracking URI, which it reads from the environment.
        with mock.patch.dict(os.environ, {"MLFLOW_TRACKING_URI": mlflow_server}):
            table = client.load_table(experiment.experiment_id, artifact, run_ids=[run.info.run_id])
        assert list(table.columns) == ["id", "image", "guess", "truth", "score_0", "score_1", "score_2"]
        assert table["id"].tolist() == list(expected.ids)
        assert table["guess"].tolist() == list(expected.guesses)
        assert table["truth"].tolist() == list(expected.truths)
        np.testing.assert_allclose(table[["score_0", "score_1", "score_2"]].to_numpy(), expected.scores)
        for cell, image in zip(table["image"], expected.images):
            local = client.download_artifacts(run.info.run_id, cell["filepath"], str(two_process_job["root"]))
            np.testing.assert_array_equal(png_pixels(local), image)
