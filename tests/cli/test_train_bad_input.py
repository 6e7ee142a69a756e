"""Bad input: a one-line error with a HINT, non-zero exit, quickly, nothing written or damaged."""

from __future__ import annotations

import re

import pytest

from conftest import run_shoal
from shoal.cli.train import _gpu_device_files


def _assert_clean_error(result, *needles):
    assert result.returncode != 0
    err = result.stderr
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-2].startswith("shoal: error: "), err
    assert lines[-1].startswith("HINT: "), err
    for needle in needles:
        assert needle in err, err


TORCH = re.compile(r"^import time:.*\|\s+torch$", re.M)
"""``import torch`` in ``-X importtime``'s lines (``PYTHONPROFILEIMPORTTIME=1``)."""


@pytest.mark.parametrize(
    "args, needles, before_torch",
    [
        (["train", "imagenet"], ["unknown workload 'imagenet'", "digits"], True),
        (["train", "pkg.module:"], ["workload spec 'pkg.module:' is incomplete"], True),
        (["train", "synthetic", "--arch", "resnet7"], ["unknown architecture 'resnet7'", "resnet18"], True),
        (["train", "cifar10", "--arch", "mlp"], ["cifar10 trains a ResNet; --arch 'mlp'", "resnet18"], True),
        (["train", "language", "--arch", "huge"], ["no model preset 'huge'", "tiny, small, large"], True),
        (["train", "digits", "--nproc", "0"], ["--nproc must be at least 1"], True),
        (["train", "digits", "--batch-size", "0"], ["--batch-size must be at least 1"], True),
        # said before torch loads where no GPU device file exists; else torch is asked
        (["train", "digits", "--device", "cuda"], ["CUDA is not available"], not _gpu_device_files()),
        (["train", "digits", "--amp", "fp8"], ["--amp 'fp8' is not one of"], True),
        (["train", "digits", "--strategy", "fsdp", "--comm-hook", "bf16"], ["works only with --strategy ddp"], True),
        (["train", "mnist"], ["needs a data directory", "--data"], False),
        (["train", "digits", "--resume", "no/such/ckpt-e00001.pt"], ["no such checkpoint", "--resume auto"], True),
    ],
)
def test_bad_input_is_one_line_with_hint(args, needles, before_torch, tmp_path):
    result = run_shoal(*args, "--out", str(tmp_path / "out"), timeout=120, env={"PYTHONPROFILEIMPORTTIME": "1"})
    _assert_clean_error(result, *needles)
    assert not (tmp_path / "out" / "config.json").exists()
    # A flag or a workload name that is wrong on its face is said before torch loads (2-3 s of CPU).
    assert bool(TORCH.search(result.stderr)) is not before_torch, args


def test_missing_dataset_names_files_and_download(tmp_path):
    result = run_shoal("train", "mnist", "--data", str(tmp_path / "nothing"), "--out", str(tmp_path / "o"))
    _assert_clean_error(result, "train-images-idx3-ubyte", "--download")
    result = run_shoal("train", "cifar10", "--data", str(tmp_path / "nothing"), "--out", str(tmp_path / "o"))
    _assert_clean_error(result, "data_batch_1", "--download")


@pytest.mark.parametrize("nproc", ["1", "2"])
def test_unwritable_output_directory(tmp_path, nproc):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = run_shoal("train", "digits", "--nproc", nproc, "--epochs", "1", "--out", str(blocker / "run"))
    _assert_clean_error(result, "not writable", "--out")
    assert blocker.read_text() == "not a directory"


def test_run_killed_before_its_first_epoch_starts_over(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text('{"old": true}')
    result = run_shoal("train", "digits", "--epochs", "1", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "starting from the beginning" in result.stdout
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1


def test_existing_run_is_not_overwritten(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text('{"old": true}')
    (out / "metrics.jsonl").write_text('{"epoch": 1}\n')
    result = run_shoal("train", "digits", "--epochs", "1", "--out", str(out))
    _assert_clean_error(result, "already holds a previous run")
    assert (out / "config.json").read_text() == '{"old": true}'
    assert (out / "metrics.jsonl").read_text() == '{"epoch": 1}\n'
