"""The tracker's contract without a server: names, missing packages, import cost, other ranks,
resume state, predictions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from unittest import mock

import numpy as np
import pytest
import torch

from shoal.errors import ShoalError
from shoal.tracking import Predictions, create_tracker, parse_spec, reduce_metrics
from shoal.tracking.predictions import to_uint8_image
from tracking.readers import tb_series, tensorboard

TRACKER_LIBRARIES = ("wandb", "mlflow", "tensorboard")


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, env=env
    )


def test_public_names():
    import shoal.tracking

    assert sorted(shoal.tracking.__all__) == sorted(shoal.tracking._EXPORTS)
    assert all(getattr(shoal.tracking, name) is not None for name in shoal.tracking.__all__)


def test_spec_parsing():
    assert parse_spec("wandb,tensorboard,mlflow") == ("wandb", "tensorboard", "mlflow")
    assert parse_spec(" MLflow , wandb,wandb ") == ("mlflow", "wandb")
    assert parse_spec(["tensorboard"]) == ("tensorboard",)
    assert parse_spec(None) == parse_spec("") == parse_spec("none") == ()
    with pytest.raises(ShoalError) as err:
        parse_spec("wandb,comet")
    assert err.value.message == "unknown tracker 'comet'; the trackers are wandb, tensorboard, mlflow"
    assert "\n" not in err.value.format().split("\nHINT: ")[0]


@pytest.mark.parametrize("name", TRACKER_LIBRARIES)
@pytest.mark.parametrize("rank", [0, 1])
def test_a_missing_package_is_one_error_with_the_pip_command(name, rank, tool_env, tmp_path):
    code = f"""
        import importlib.abc, sys

        class Hide(importlib.abc.MetaPathFinder):  # as if {name} were not installed
            def find_spec(self, fullname, path=None, target=None):
                if fullname.split(".")[0] == {name!r}:
                    raise ModuleNotFoundError(f"No module named {{fullname!r}}")
                return None

        sys.meta_path.insert(0, Hide())
        from shoal.errors import ShoalError
        from shoal.tracking import create_tracker
        try:
            create_tracker("tensorboard,{name}", run_dir={str(tmp_path / "run")!r}, rank={rank})
        except ShoalError as err:
            print(err.format())
    """
    proc = run_python(code, tool_env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"shoal: error: the {name} tracker needs the {name} package, which is not installed",
        f"HINT: pip install 'shoal[{name}]' (or drop {name} from --tracker)",
    ]


def test_importing_and_using_it_on_other_ranks_loads_no_tracker_library(tool_env, tmp_path):
    code = f"""
        import json, sys
        import shoal.tracking
        after_import = sorted(m for m in ("wandb", "mlflow", "tensorboard", "torch") if m in sys.modules)
        from shoal.tracking import Predictions, create_tracker
        import numpy as np

        tracker = create_tracker("wandb,tensorboard,mlflow", run_dir={str(tmp_path / "run")!r}, rank=1, config={{"a": 1}})
        tracker.log({{"loss": 1.0}}, step=1)
        tracker.log_epoch({{"epoch": 1, "test_accuracy": 0.5}}, step=1)
        tracker.log_predictions(Predictions.from_logits(np.zeros((2, 3)), [0, 1], np.zeros((2, 4, 4))), step=1)
        state = tracker.state_dict()
        tracker.close()
        used = sorted(m for m in ("wandb", "mlflow", "tensorboard", "torch") if m in sys.modules)
        print(json.dumps([after_import, used, tracker.enabled, state]))
    """
    proc = run_python(code, tool_env)
    assert proc.returncode == 0, proc.stderr
    after_import, used, enabled, state = json.loads(proc.stdout)
    assert after_import == [] and used == []
    assert enabled is False and state == {"format": 1, "step": 1, "trackers": {}}
    assert not (tmp_path / "run").exists()  # a rank other than 0 writes nothing


def test_the_rank_comes_from_the_launcher_when_not_given(tmp_path):
    torchrun_rank_1 = {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1",
    }
    with mock.patch.dict(os.environ, torchrun_rank_1):
        assert create_tracker("tensorboard", run_dir=tmp_path).names == ()
    with mock.patch.dict(os.environ, {**torchrun_rank_1, "RANK": "0", "LOCAL_RANK": "0"}):
        assert create_tracker("tensorboard", run_dir=tmp_path).names == ("tensorboard",)


def test_state_round_trip_and_misuse(tmp_path, capsys):
    tracker = create_tracker("tensorboard", run_dir=tmp_path / "a", rank=0, max_predictions=2)
    assert tracker.state_dict() == {"format": 1, "step": None, "trackers": {}}
    tracker.log({"loss": torch.tensor(0.5), "note": "text"}, step=3)
    tracker.log_predictions(Predictions.from_logits(np.eye(3), [0, 1, 2], np.zeros((3, 4, 4))), step=3)
    with pytest.raises(ShoalError, match="loaded after it had started logging"):
        tracker.load_state_dict({"format": 1, "step": 1, "trackers": {}})
    with pytest.raises(ValueError, match="non-negative int"):
        tracker.log({"loss": 1.0}, step=-1)
    state = tracker.state_dict()
    tracker.close()
    assert state == {
        "format": 1,
        "step": 3,
        "trackers": {"tensorboard": {"log_dir": str(tmp_path / "a" / "tensorboard")}},
    }
    err = capsys.readouterr().err.splitlines()
    assert "shoal: tracker: ignoring 'note': not a number (str)" in err
    assert "shoal: tracker: predictions tables keep their first 2 of 3 rows" in err
    board = tensorboard(tmp_path / "a" / "tensorboard")
    assert tb_series(board, "loss") == {3: 0.5}
    assert sorted(tag for tag in board.Tags()["images"]) == ["predictions/0", "predictions/1"]

    with pytest.raises(ShoalError, match="tracker state format 7 is not 1"):
        create_tracker("tensorboard", run_dir=tmp_path / "b", rank=0, state={"format": 7})
    resumed = create_tracker("tensorboard", run_dir=tmp_path / "a", rank=0, state=state)
    resumed.log({"loss": 0.25}, step=4)
    resumed.close()
    assert tb_series(tensorboard(tmp_path / "a" / "tensorboard"), "loss") == {3: 0.5, 4: 0.25}


def test_reduce_metrics_in_one_process():
    assert reduce_metrics({"loss": torch.tensor(2.0), "correct": 3}, count=4, sums=["correct"]) == {
        "loss": 2.0,
        "correct": 3.0,
    }
    with pytest.raises(ValueError, match="sums names"):
        reduce_metrics({"loss": 1.0}, sums=["correct"])


def test_predictions_from_logits():
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 5.0]], dtype=torch.bfloat16)
    predictions = Predictions.from_logits(
        logits, torch.tensor([0, 1]), torch.zeros(2, 1, 4, 4), ids=[10, 11], class_names=["a", "b", "c"]
    )
    assert predictions.columns == ["id", "image", "guess", "truth", "score_a", "score_b", "score_c"]
    np.testing.assert_allclose(predictions.scores.sum(axis=1), [1.0, 1.0])
    rows = predictions.rows()
    assert [(r[0], r[2], r[3]) for r in rows] == [(10, "a", "a"), (11, "c", "b")]
    assert rows[0][1].shape == (4, 4) and rows[0][1].dtype == np.uint8
    with pytest.raises(ValueError, match="class names"):
        Predictions.from_logits(np.zeros((1, 3)), [0], np.zeros((1, 2, 2)), class_names=["a"])


def test_images_become_8_bit():
    unit = np.array([[0.0, 0.5], [1.0, 0.25]])
    np.testing.assert_array_equal(to_uint8_image(unit), [[0, 128], [255, 64]])
    normalised = np.array([[-1.0, 0.0], [1.0, 3.0]])  # stretched from its own min..max
    np.testing.assert_array_equal(to_uint8_image(normalised), [[0, 64], [128, 255]])
    rgb_first = np.zeros((3, 5, 4), dtype=np.uint8)
    assert to_uint8_image(rgb_first).shape == (5, 4, 3)
    assert to_uint8_image(np.zeros((5, 4, 1))).shape == (5, 4)
    with pytest.raises(ValueError, match="1 or 3 channels"):
        to_uint8_image(np.zeros((5, 4, 2)))


def test_a_backend_that_falls_behind_is_switched_off_and_close_is_bounded(capsys):
    """The sink's own rules, with a backend that blocks until released (as on a hung server)."""
    from pathlib import Path

    from shoal.tracking.backend import Backend, RunOptions
    from shoal.tracking.sink import Sink

    entered, release = threading.Event(), threading.Event()

    class Stuck(Backend):
        name = "stuck"

        def open(self) -> None:
            entered.set()
            release.wait(60)

        def log_scalars(self, values, step, timestamp) -> None:
            pass

        def close(self, failed: bool) -> None:
            pass

    lines: list[str] = []
    sink = Sink(Stuck(RunOptions(Path("."), "p", "r"), None, lines.append), lines.append, max_pending=3)
    sink.start()  # queues open(), which blocks
    assert entered.wait(30)
    for step in range(10):
        sink.submit(sink.backend.log_scalars, {"x": 1.0}, step, 0.0)
    assert sink.failed and lines == ["failed and is now off (it is not keeping up (3 calls waiting)); training goes on"]
    sink.close(failed=False)
    assert sink.join(time.monotonic() + 0.5) is False  # still stuck in open(): left behind
    release.set()
    assert sink.join(time.monotonic() + 30) is True
    assert len(lines) == 1


def test_what_the_backends_threads_would_import_lazily_is_imported_before_they_start(tool_env, tmp_path):
    # W&B's and TensorBoard's threads importing PIL at once for their first images could hand one
    # of them a partly initialised PIL.Image (importlib's deadlock detection), switching it off.
    code = f"""
        import json, sys, threading
        from shoal.tracking import create_tracker

        tracker = create_tracker("wandb,tensorboard", run_dir={str(tmp_path / "run")!r}, rank=0)
        threads = [t.name for t in threading.enumerate() if t.name.startswith("shoal-tracker")]
        loaded = sorted(m for m in ("PIL.Image", "wandb.sdk.data_types.image") if m in sys.modules)
        tracker.close()
        print(json.dumps([threads, loaded]))
    """
    proc = run_python(code, tool_env)
    assert proc.returncode == 0, proc.stderr
    threads, loaded = json.loads(proc.stdout)
    assert threads == [] and loaded == ["PIL.Image", "wandb.sdk.data_types.image"]
