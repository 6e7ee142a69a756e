"""A training loop's logging, driven by a JSON plan (argv[1]), for the tracking tests.

Every rank: per-rank numbers reduced exactly (``reduce_metrics``), then the tracker (a no-op
except on rank 0) logs the train loss every step, an epoch record every ``epoch_steps`` steps and a
predictions table with it. Optional: save the tracker's state with a real shoal checkpoint at
``save_at``, resume from it, log a metric name MLflow refuses at ``bad_metric_at``, SIGKILL itself
after ``kill_after`` (or right after the checkpoint: ``kill_after_save``), or count connections to a loopback "W&B server" (``listen``).

The expected values are functions of the step, so the tests recompute them (see ``expected_*``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np

CONFIG = {"lr": 0.1, "optimizer": "sgd", "model": {"width": 128, "depth": 3}}
PREDICTION_ROWS = 5
CLASSES = 3


def rank_value(step: int, rank: int) -> float:
    return 1.0 / step + rank


def rank_count(rank: int) -> int:
    return 1 + 2 * rank


def expected_loss(step: int, world_size: int, offset: float = 0.0) -> float:
    """The exact mean over every sample: sum(count_r * value_r) / sum(count_r)."""
    counts = [rank_count(r) for r in range(world_size)]
    return sum(c * rank_value(step, r) for r, c in enumerate(counts)) / sum(counts) + offset


def expected_epoch(epoch: int) -> dict[str, float]:
    return {"epoch": epoch, "train_loss": 1.0 / epoch, "test_accuracy": 0.5 + epoch / 100}


def expected_predictions(step: int):
    from shoal.tracking import Predictions

    rng = np.random.default_rng(step)
    logits = rng.normal(size=(PREDICTION_ROWS, CLASSES))
    images = rng.random((PREDICTION_ROWS, 8, 8))
    targets = rng.integers(0, CLASSES, size=PREDICTION_ROWS)
    ids = [1000 + step + i for i in range(PREDICTION_ROWS)]
    return Predictions.from_logits(logits, targets, images, ids=ids)


def listen() -> tuple[str, list[int]]:
    """A loopback 'server' that counts connections and closes them at once."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[int] = []

    def serve() -> None:
        while True:
            conn, _ = server.accept()
            accepted.append(1)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{server.getsockname()[1]}", accepted


def main() -> None:
    plan = json.loads(sys.argv[1])
    accepted: list[int] = []
    if plan.get("listen"):
        os.environ["WANDB_BASE_URL"], accepted = listen()

    from shoal.checkpoint.manager import CheckpointManager
    from shoal.tracking import create_tracker, reduce_metrics

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1:
        import shoal

        ctx = shoal.init(device="cpu")
        rank = ctx.rank
    else:
        ctx, rank = None, 0

    tracker = create_tracker(
        plan["spec"],
        run_dir=plan["run_dir"],
        project=plan.get("project", "shoal-tests"),
        run_name=plan.get("run_name"),
        config=CONFIG,
        mlflow_uri=plan.get("mlflow_uri"),
        init_timeout=plan.get("init_timeout", 30.0),
        close_timeout=plan.get("close_timeout", 60.0),
        # The tests prove what a checkpoint makes durable, not how fast: on a loaded machine W&B's
        # writer and MLflow's requests took longer than the default 10 s.
        state_timeout=plan.get("state_timeout", 120.0),
    )
    checkpoints = CheckpointManager(plan["checkpoint_dir"]) if plan.get("checkpoint_dir") else None
    if checkpoints is not None and plan.get("resume"):
        found = checkpoints.resume({"tracker": tracker})
        assert found is not None, "nothing to resume from"

    reduced = {}
    save_at = plan.get("save_at")
    for step in range(plan["first_step"], plan["last_step"] + 1):
        offset = plan.get("offset_after_save", 0.0) if save_at is not None and step > save_at else 0.0
        stats = reduce_metrics(
            {"loss": rank_value(step, rank), "seen": rank_count(rank)}, count=rank_count(rank), sums=["seen"]
        )
        reduced[step] = stats
        tracker.log({"train/loss": stats["loss"] + offset, "train/lr": 0.1}, step=step)
        if step == plan.get("bad_metric_at"):
            tracker.log({"bad metric@": 1.0}, step=step)  # MLflow refuses '@' in a metric name
        if step % plan["epoch_steps"] == 0:
            epoch = step // plan["epoch_steps"]
            tracker.log_epoch(expected_epoch(epoch), step=step)
            if plan.get("predictions", True):
                tracker.log_predictions(expected_predictions(step), step=step)
        if checkpoints is not None and step == save_at:  # state_dict() flushes first
            checkpoints.save(epoch=1, step=step, objects={"tracker": tracker})
            if plan.get("kill_after_save"):  # no flush, no grace: what the checkpoint holds must be written
                os.kill(os.getpid(), signal.SIGKILL)
        if step == plan.get("kill_after"):
            tracker.flush()  # what was logged is written now: no grace before the kill
            os.kill(os.getpid(), signal.SIGKILL)
    print("loop finished", flush=True)
    if plan.get("wait_for"):  # the test's signal that a tracker is now stuck on its server
        deadline = time.monotonic() + 120
        while not Path(plan["wait_for"]).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    state = tracker.state_dict() if plan.get("report_state", True) else None
    tracker.close()
    print("closed", flush=True)
    loaded = sorted(
        name for name in ("wandb", "mlflow", "tensorboard", "torch.utils.tensorboard") if name in sys.modules
    )
    result = {"rank": rank, "modules": loaded, "reduced": reduced, "state": state, "connections": len(accepted)}
    Path(plan["result_dir"], f"rank{rank}.json").write_text(json.dumps(result))
    if ctx is not None:
        ctx.shutdown()


if __name__ == "__main__":
    main()
