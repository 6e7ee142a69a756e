"""A tracker never fails or stalls a job: a backend that raises mid-run is switched off with one
message while the others go on, and closing a backend stuck on a server that never answers is
bounded."""

from __future__ import annotations

import socket
import threading

import pytest
from mlflow import MlflowClient

from tracking.harness import run_job
from tracking.readers import mlflow_series, tb_series, tensorboard, wandb_runs
from tracking.scripts.tracked_job import expected_loss

LAST = 8


def test_a_tracker_that_raises_mid_run_is_switched_off_once(run_job_here, mlflow_server):
    plan = {
        "spec": "wandb,tensorboard,mlflow",
        "project": "raises",
        "mlflow_uri": mlflow_server,
        "first_step": 1,
        "last_step": LAST,
        "epoch_steps": 4,
        "bad_metric_at": 3,  # MLflow refuses the name 'bad metric@'; W&B and TensorBoard take it
    }
    proc, results, run_dir, env = run_job_here(plan)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "loop finished" in proc.stdout and "closed" in proc.stdout
    reports = [line for line in proc.stderr.splitlines() if "failed and is now off" in line]
    assert len(reports) == 1, proc.stderr
    assert reports[0].startswith("shoal: tracker mlflow: failed and is now off (") and "bad metric@" in reports[0]
    assert reports[0].endswith("; training goes on")

    # The other two logged everything, the bad name included.
    board = tensorboard(run_dir / "tensorboard")
    assert set(tb_series(board, "train/loss")) == set(range(1, LAST + 1))
    assert tb_series(board, "bad metric@") == {3: 1.0}
    (run,) = wandb_runs(run_dir, env)
    assert set(run.series("train/loss")) == set(range(1, LAST + 1)) and run.series("bad metric@") == {3: 1.0}
    # MLflow kept what came before the error, nothing after it, and its run was ended as failed.
    client = MlflowClient(tracking_uri=mlflow_server)
    (mlrun,) = client.search_runs([client.get_experiment_by_name("raises").experiment_id])
    assert mlflow_series(client, mlrun.info.run_id, "train/loss") == pytest.approx(
        {s: expected_loss(s, 1) for s in (1, 2, 3)}
    )
    assert mlrun.info.status == "FAILED"


@pytest.fixture
def black_hole(tmp_path):
    """A loopback port that accepts connections and never answers (a hung server); the file it
    yields appears once a client is connected."""
    server = socket.create_server(("127.0.0.1", 0))
    connected = tmp_path / "connected"
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
                connected.touch()
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}", held, connected
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_closing_a_tracker_stuck_on_a_silent_server_is_bounded(run_job_here, black_hole):
    uri, held, connected = black_hole
    # close only once MLflow is waiting on the server
    proc, run_dir = _with_mlflow_stuck(run_job_here, uri, wait_for=str(connected))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "loop finished" in proc.stdout and "closed" in proc.stdout
    assert held, "MLflow never reached the server"
    assert "shoal: tracker mlflow: did not finish within 3 s; left behind" in proc.stderr
    board = tensorboard(run_dir / "tensorboard")  # the other tracker was not held up
    assert set(tb_series(board, "train/loss")) == set(range(1, LAST + 1))


def test_a_checkpoint_goes_on_past_a_tracker_stuck_on_its_server_and_says_which(run_job_here, black_hole, tmp_path):
    uri, _, _ = black_hole
    checkpoints = tmp_path / "checkpoints"
    proc, run_dir = _with_mlflow_stuck(run_job_here, uri, checkpoint_dir=str(checkpoints), save_at=4, state_timeout=2)
    assert proc.returncode == 0, proc.stderr[-4000:]
    said = [line for line in proc.stderr.splitlines() if line.startswith("shoal: tracker: ")]
    assert said == [
        "shoal: tracker: mlflow had not made step 4 durable within 2 s of the checkpoint; a job stopped right "
        "after it may lose those steps there (create_tracker(state_timeout=...) waits longer)"
    ], proc.stderr
    assert len(list(checkpoints.glob("ckpt-*.pt"))) == 1  # the checkpoint was not held up
    assert set(tb_series(tensorboard(run_dir / "tensorboard"), "train/loss")) == set(range(1, LAST + 1))


def _with_mlflow_stuck(run_job_here, uri: str, **plan):
    """The job with TensorBoard and an MLflow whose server never answers: ``(proc, run_dir)``. MLflow
    would wait 300 s for each answer (and retry): only shoal's bounds end this job."""
    plan = {"spec": "tensorboard,mlflow", "mlflow_uri": uri, "first_step": 1, "last_step": LAST, "epoch_steps": 4,
            "close_timeout": 3, "report_state": False, **plan}  # fmt: skip
    proc, _, run_dir, _ = run_job_here(plan, env={"MLFLOW_HTTP_REQUEST_TIMEOUT": "300"}, timeout=200)
    return proc, run_dir


@pytest.fixture
def run_job_here(tmp_path, tool_env):
    def run(plan, env=None, timeout=240):
        run_dir = tmp_path / "run"
        proc, results = run_job(
            {"run_dir": str(run_dir), **plan}, tmp_path / "results", {**tool_env, **(env or {})}, timeout=timeout
        )
        return proc, results, run_dir, tool_env

    return run
