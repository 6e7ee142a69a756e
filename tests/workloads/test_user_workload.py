"""Your own workload: specs resolved to instances, and mistakes in it as one line naming your file.

The user's code lives in a real file outside the package (tmp_path), imported by path or as a
module from PYTHONPATH, exactly as ``shoal train path.py:Name`` / ``pkg.module:Name`` do.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import shoal
from conftest import run_shoal
from shoal.errors import ShoalError
from shoal.train.config import TrainConfig
from shoal.workloads import get_workload, label, short_name
from workloads.user_workload_files import BAD, GOOD, line_of, write


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    write(tmp_path, "my_workload.py", GOOD)
    write(tmp_path, "bad_workload.py", BAD)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_class_an_instance_and_a_factory_by_file_path(user_dir):
    cls = get_workload("my_workload.py:Tiny")
    instance = get_workload("my_workload.py:tiny")
    made = get_workload("my_workload.py:make_tiny")
    assert [type(w).__name__ for w in (cls, instance, made)] == ["Tiny", "Tiny", "Tiny"]
    assert (cls.hidden, instance.hidden, made.hidden) == (16, 8, 12)
    assert isinstance(cls, shoal.Workload)
    # What config.json records names the class again, and re-resolves to it.
    assert label(made) == "my_workload.py:Tiny"
    assert type(get_workload(label(made))) is type(cls)
    assert short_name("my_workload.py:Tiny") == "Tiny" and short_name("digits") == "digits"


def test_a_module_on_the_python_path(user_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(user_dir))
    workload = get_workload("my_workload:Tiny")
    assert type(workload).__module__ == "my_workload" and label(workload) == "my_workload:Tiny"


def test_the_workloads_defaults_fill_the_config_once(user_dir):
    cfg = TrainConfig(workload="my_workload.py:Tiny", lr=0.3).resolved()
    # Its own epochs/batch/lr (the flag wins over lr), shoal's fallback for what it leaves out.
    assert (cfg.epochs, cfg.batch_size, cfg.lr, cfg.optimizer, cfg.weight_decay) == (2, 8, 0.3, "sgd", 0.0)
    instance = get_workload("my_workload.py:Tiny")
    instance.defaults = {"epochs": 5, "epoch": 1}
    with pytest.raises(ShoalError, match="unknown key.*epoch$") as info:
        TrainConfig(workload="my_workload.py:Tiny").resolved(instance)
    assert "warmup_epochs" in info.value.hint


def test_a_user_dataset_class_trains_in_this_process(user_dir):
    """Not tensors: a Dataset of (features, label) items, evaluated exactly, checkpointed."""
    result = shoal.fit("my_workload.py:Tiny", out=str(user_dir / "run"), progress=False, device="cpu")
    assert [m["epoch"] for m in result.metrics] == [1, 2] and result.config.epochs == 2
    assert all(m["samples_seen"] == 96 for m in result.metrics)
    assert result.accuracies[-1] > 0.6  # three well-separated blobs; chance is 1/3
    config = json.loads((user_dir / "run" / "config.json").read_text())
    assert config["workload"] == "my_workload.py:Tiny"
    assert len(list((user_dir / "run" / "checkpoints").glob("ckpt-*.pt"))) == 2


def test_its_own_loss_and_metric(user_dir):
    result = shoal.fit(get_workload("my_workload.py:Regression"), out=str(user_dir / "r"), progress=False)
    (record,) = result.metrics
    assert "test_accuracy" not in record and record["test_abs_error"] > 0
    assert result.accuracies == [None]
    assert result.config.workload == "my_workload.py:Regression" and result.config.lr == 0.01


def _fails(*args, cwd, nproc=None):
    """``shoal train ARGS`` that must fail with one line and a HINT, no traceback."""
    extra = ["--nproc", str(nproc)] if nproc else []
    result = run_shoal("train", *args, "--out", "run", "--no-progress", "--device", "cpu", *extra, cwd=cwd, timeout=240)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    return result.stderr


@pytest.mark.parametrize(
    "spec, expected, hint",
    [
        ("missing.py:Tiny", "no such file missing.py", "path of a .py file"),
        ("no_such_pkg.mod:Tiny", "no module named 'no_such_pkg.mod'", "PYTHONPATH"),
        ("my_workload.py:Nope", "my_workload.py has no 'Nope'", "e.g. my_workload.py:"),
        ("bad_workload.py:NOT_A_WORKLOAD", "is of type int, not a shoal.Workload", "subclass shoal.Workload"),
        ("imagenet", "unknown workload 'imagenet'", "path/to/file.py:Name"),
        ("my_workload.py:", "is incomplete", "pkg.module:Name"),
    ],
)
def test_a_bad_spec_is_one_line_and_a_hint(user_dir, spec, expected, hint):
    with pytest.raises(ShoalError) as info:
        shoal.fit(spec, out=str(user_dir / "run"))
    assert expected in info.value.message and "\n" not in info.value.message
    assert hint in info.value.hint
    assert not (user_dir / "run").exists()


def test_a_factory_returning_something_else_names_its_line(user_dir):
    at = line_of(BAD, "def not_a_factory")
    with pytest.raises(
        ShoalError, match=f"^bad_workload.py:{at}: workload spec .* returned a str, not a shoal.Workload"
    ):
        get_workload("bad_workload.py:not_a_factory")


def test_an_import_error_in_the_users_file_names_its_line(user_dir):
    """Through the CLI: exit status 2, the user's file and line, the HINT, no traceback."""
    write(user_dir, "broken.py", "import torch\n\nimport no_such_module_xyz\n")
    write(user_dir, "typo.py", "import torch\nx = (1 +\n")
    stderr = _fails("broken.py:Tiny", cwd=user_dir)
    assert "shoal: error: broken.py:3: importing broken.py failed: ModuleNotFoundError" in stderr, stderr
    assert "HINT: fix the error in your file" in stderr
    with pytest.raises(ShoalError, match="^typo.py:2: importing typo.py failed: SyntaxError"):
        get_workload("typo.py:X")


def test_a_dataset_that_raises_names_the_users_line(user_dir):
    at = line_of(BAD, 'raise ValueError(f"cannot read sample')
    expected = f"bad_workload.py:{at}: training of BadData failed: ValueError: cannot read sample"
    with pytest.raises(ShoalError) as info:
        shoal.fit("bad_workload.py:BadData", out=str(user_dir / "run"), progress=False)
    assert info.value.message.startswith(expected) and "fix your workload's code" in info.value.hint


def test_a_model_that_does_not_fit_the_loss_names_build_model(user_dir):
    at = line_of(BAD, "return nn.Linear(4, 1)") - 1  # Misfit's build_model
    with pytest.raises(ShoalError) as info:
        shoal.fit("bad_workload.py:Misfit", out=str(user_dir / "run"), progress=False)
    expected = f"bad_workload.py:{at}: the model of Misfit does not fit its loss (output [4, 1] and targets [4])"
    assert info.value.message.startswith(expected), info.value.message
    assert "make build_model's model return what loss() takes" in info.value.hint


def test_a_model_of_torch_layers_that_cannot_take_the_inputs_names_build_model(user_dir):
    at = line_of(BAD, "nn.Linear(5, 8)") - 1  # WrongInput's build_model
    with pytest.raises(ShoalError) as info:
        shoal.fit("bad_workload.py:WrongInput", out=str(user_dir / "run"), progress=False)
    expected = f"bad_workload.py:{at}: the model of WrongInput failed on a batch: RuntimeError: "
    assert info.value.message.startswith(expected), info.value.message
    assert "(4x4 and 5x8)" in info.value.message  # torch's own words on the shapes
    assert "take the inputs your data gives" in info.value.hint


@pytest.mark.multiprocess
def test_user_errors_on_two_workers_are_the_users_line_and_no_orphan(user_dir):
    """Both ranks fail in the user's code: their one line, the HINT, exit 2, no worker left behind."""
    stderr = _fails("bad_workload.py:Misfit", cwd=user_dir, nproc=2)
    at = line_of(BAD, "return nn.Linear(4, 1)") - 1
    assert f"shoal: error: bad_workload.py:{at}: the model of Misfit does not fit its loss" in stderr, stderr
    assert "HINT: make build_model's model return" in stderr
    assert not _processes_in(user_dir)


def _processes_in(directory):
    """PIDs of live processes whose working directory is ``directory`` (the run's workers)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if Path(os.readlink(proc / "cwd")) == directory:
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def test_cifar10_honours_arch_and_refuses_a_non_resnet(tmp_path):
    from shoal.workloads.cifar10 import cifar_resnet

    model = cifar_resnet("resnet34")
    assert sum(1 for m in model.modules() if isinstance(m, torch.nn.Conv2d)) == 36  # ResNet-34, not 18
    assert model.conv1.kernel_size == (3, 3) and isinstance(model.maxpool, torch.nn.Identity)
    cfg = TrainConfig(workload="cifar10", arch="resnet152", data=str(tmp_path))
    assert sum(p.numel() for p in get_workload("cifar10").build_model(cfg, 10).parameters()) > 50_000_000
    with pytest.raises(ShoalError, match="^cifar10 trains a ResNet; --arch 'mlp' is not one$") as info:
        shoal.fit("cifar10", arch="mlp", data=str(tmp_path), out=str(tmp_path / "r"))
    assert info.value.hint == "choose --arch from: resnet18, resnet34, resnet50, resnet101, resnet152"


def test_trackers_get_the_users_metrics_and_predictions_from_a_dataset(user_dir):
    """The predictions table is collated from the user's Dataset items (pictures: a display_images
    that shapes the 4 features as 2x2); a regression's own metric is logged and, its outputs being
    no class scores, no table is made."""
    from tracking.readers import tb_series, tensorboard

    options = {"tracker": "tensorboard", "log_predictions": 4, "progress": False, "epochs": 1}
    shoal.fit("my_workload.py:Tiny", out=str(user_dir / "features"), **options)  # no pictures: no table
    assert not any("predictions" in tag for tag in tensorboard(user_dir / "features" / "tensorboard").Tags()["images"])
    shoal.fit("my_workload.py:Pictures", out=str(user_dir / "c"), **options)
    board = tensorboard(user_dir / "c" / "tensorboard")
    assert any("predictions" in tag for tag in board.Tags()["images"])
    assert list(tb_series(board, "epoch/test_accuracy")) == [12]  # 96 samples / batch 8
    shoal.fit("my_workload.py:Regression", out=str(user_dir / "r"), **options)
    board = tensorboard(user_dir / "r" / "tensorboard")
    assert not any("predictions" in tag for tag in board.Tags()["images"])
    assert list(tb_series(board, "epoch/test_abs_error")) == [12]
