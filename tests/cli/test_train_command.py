"""``shoal train`` end to end: real worker processes over gloo, real files on disk.

One single-process run (digits, batch 32, 3 epochs, seed 7) is made once and is the reference of
two tests: 2 workers with half the batch, and gradient accumulation over two half batches.
"""

from __future__ import annotations

import json

import pytest
import torch

from conftest import run_shoal
from shoal.workloads.digits import TEST_SIZE

pytestmark = pytest.mark.multiprocess


COMMON = ["train", "digits", "--device", "cpu", "--epochs", "3", "--seed", "7"]


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def one_worker_batch_32(tmp_path_factory):
    """1 worker x batch 32, 3 epochs, seed 7: what 2 workers x batch 16 and batch 16 x 2
    accumulated micro-batches must each end on."""
    out = tmp_path_factory.mktemp("one") / "one"
    one = run_shoal(*COMMON, "--nproc", "1", "--batch-size", "32", "--out", str(out))
    assert one.returncode == 0, one.stderr
    return out


def test_demo_two_workers_reaches_accuracy_and_writes_outputs(tmp_path):
    """The README's main job: digits on 2 local workers, CPU, >= 0.95 test accuracy."""
    out = tmp_path / "run"
    result = run_shoal("train", "digits", "--nproc", "2", "--device", "cpu", "--out", str(out), timeout=240)
    assert result.returncode == 0, result.stderr + result.stdout
    metrics = _metrics(out)
    assert [m["epoch"] for m in metrics] == list(range(1, len(metrics) + 1))
    last = metrics[-1]
    assert last["test_accuracy"] >= 0.95
    assert last["world_size"] == 2 and last["global_batch_size"] == 64
    assert all(m["samples_seen"] == 1440 for m in metrics)
    for key in ("train_loss", "test_loss", "samples_per_s", "epoch_s", "lr"):
        assert isinstance(last[key], float)
    assert json.loads((out / "accuracies.json").read_text()) == [m["test_accuracy"] for m in metrics]
    config = json.loads((out / "config.json").read_text())
    assert config["workload"] == "digits" and config["extra"]["world_size"] == 2
    assert config["extra"]["environment"] == "torchrun"  # the elastic agent's variables
    # model.pt is a plain state dict of the unwrapped model: no "module." prefixes, loads weights-only.
    from shoal.workloads.digits import Digits

    state = torch.load(out / "model.pt", weights_only=True)
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in state)
    Digits().build_model(None, 10).load_state_dict(state)
    # Rank 0 alone prints the per-epoch summary lines.
    assert result.stdout.count(f"epoch {len(metrics)}/{len(metrics)}") == 1
    assert "global batch 64" in result.stdout


def test_two_workers_equal_one_worker_with_double_batch(one_worker_batch_32, tmp_path):
    """2 workers x batch B and 1 worker x batch 2B see the same global batches: same weights."""
    # --eval-samples changes what is evaluated, never what is trained.
    two = run_shoal(
        *COMMON, "--nproc", "2", "--batch-size", "16", "--eval-samples", "101", "--out", str(tmp_path / "two")
    )
    assert two.returncode == 0, two.stderr
    one = one_worker_batch_32
    a = torch.load(tmp_path / "two" / "model.pt", weights_only=True)
    b = torch.load(one / "model.pt", weights_only=True)
    assert a.keys() == b.keys()
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    assert diff <= 1e-5, diff
    # ...and training moved the weights (the comparison is not between two untrained models).
    assert _metrics(one)[-1]["test_accuracy"] > 0.9
    # The first 101 test samples, each counted once by one of the 2 workers; all of them on one.
    assert _metrics(tmp_path / "two")[-1]["test_samples"] == 101
    assert _metrics(one)[-1]["test_samples"] == TEST_SIZE


def test_grad_accum_matches_larger_batch(one_worker_batch_32, tmp_path):
    """--grad-accum 2 with batch B equals batch 2B: the micro-batch losses are re-weighted."""
    acc = run_shoal(*COMMON, "--batch-size", "16", "--grad-accum", "2", "--out", str(tmp_path / "acc"))
    assert acc.returncode == 0, acc.stderr
    a = torch.load(tmp_path / "acc" / "model.pt", weights_only=True)
    b = torch.load(one_worker_batch_32 / "model.pt", weights_only=True)
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-5


def test_lr_scaling_is_applied_and_logged(tmp_path):
    out = tmp_path / "run"
    result = run_shoal(
        "train",
        "digits",
        "--nproc",
        "2",
        "--device",
        "cpu",
        "--epochs",
        "1",
        "--lr",
        "0.01",
        "--lr-scaling",
        "linear",
        "--warmup-epochs",
        "0",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    assert "lr 0.02 (base 0.01)" in result.stdout
    assert json.loads((out / "config.json").read_text())["extra"]["scaled_lr"] == pytest.approx(0.02)


def test_worker_failure_shows_its_error_and_exits_nonzero(tmp_path):
    """A workload error raised inside the workers is reported once per failing rank, exit non-zero."""
    result = run_shoal(
        "train", "digits", "--nproc", "2", "--device", "cpu", "--amp", "fp16", "--out", str(tmp_path / "run")
    )
    assert result.returncode != 0
    assert "--amp fp16 needs a CUDA device" in result.stderr
    assert "HINT:" in result.stderr
