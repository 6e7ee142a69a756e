"""The bundled ``language`` workload: a TinyGPT on offline byte-level text, trained by real workers
through ``shoal train``; exact evaluation, a model.pt that loads into a fresh TinyGPT, an exact
resume on another world size, and an unknown preset explained."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from conftest import run_shoal
from shoal.errors import ShoalError
from shoal.workloads import WORKLOADS, get_workload
from shoal.workloads.archs import LANGUAGE_PRESETS
from shoal.workloads.language import Language, as_tensors, preset_name, windows
from shoal.workloads.language_model import PRESETS, TinyGPT, lm_loss, perplexity

COMMON = ["--seed", "5", "--no-progress", "--device", "cpu", "--samples", "512", "--lr", "0.01"]


def _cfg(arch="resnet18", samples=64):
    return SimpleNamespace(workload="language", data=None, download=False, seed=0, arch=arch, image_size=32,
                           samples=samples)  # fmt: skip


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_registered_and_built_on_the_public_contract():
    assert WORKLOADS["language"] == "shoal.workloads.language:Language"
    workload = get_workload("language")
    assert isinstance(workload, Language) and workload.defaults["optimizer"] == "adamw"
    data = workload.load(_cfg(), torch.device("cpu"))
    (x, y), (tx, ty) = data.train, data.test
    assert x.shape == y.shape == (64, 32) and tx.shape == (8, 32) and data.num_classes is None
    train, test = windows(64, 8, 32)
    for i in (0, 17, 63):  # the tensors are the TokenWindows' items, row by row
        torch.testing.assert_close((x[i], y[i]), train[i], rtol=0, atol=0)
    torch.testing.assert_close(as_tensors(test), (tx, ty), rtol=0, atol=0)
    assert torch.equal(x[1:, 0], y[:-1, -1])  # windows follow one another: next tokens, shifted by one
    model = workload.build_model(_cfg(), None)
    assert isinstance(model, TinyGPT) and model.config == TinyGPT.preset("tiny").config


def test_metrics_sum_to_exact_token_means():
    workload = Language()
    torch.manual_seed(0)
    outputs, targets = torch.randn(6, 32, 256), torch.randint(0, 256, (6, 32))
    sums = workload.metrics(outputs, targets)
    mean_token_loss = lm_loss(outputs, targets).double()
    # shoal divides the sums by the number of windows: every window has 32 tokens
    assert float(sums["bits_per_byte"]) / 6 == pytest.approx(float(mean_token_loss) / math.log(2), rel=1e-12)
    hits = (outputs.argmax(-1) == targets).double().mean()
    assert float(sums["accuracy"]) / 6 == pytest.approx(float(hits), rel=1e-12)
    assert float(workload.loss(outputs, targets)) == pytest.approx(float(mean_token_loss), rel=1e-6)


def test_presets_and_an_unknown_one():
    assert [preset_name(a) for a in ("resnet18", "tiny", "small", "large")] == ["tiny", "tiny", "small", "large"]
    with pytest.raises(ShoalError, match="no model preset 'huge'"):
        preset_name("huge")
    assert tuple(PRESETS) == LANGUAGE_PRESETS  # the torch-free list the command line checks --arch against


def test_unknown_preset_is_one_line_and_a_hint(tmp_path):
    result = run_shoal("train", "language", "--arch", "huge", "--out", "run", *COMMON, cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert lines[0] == "shoal: error: the language workload has no model preset 'huge'", result.stderr
    assert lines[1].startswith("HINT: choose --arch from: tiny, small, large"), result.stderr
    assert not (tmp_path / "run" / "model.pt").exists()


@pytest.mark.multiprocess
def test_trains_on_two_workers_then_resumes_exactly_on_one(tmp_path):
    """``shoal train language --nproc 2`` for 2 epochs of 512 windows (tiny preset): the loss falls,
    evaluation is exact, model.pt loads into a fresh TinyGPT; the epoch-1 checkpoint resumed on 1
    process with the same global batch ends on the same weights and metrics."""
    ref = run_shoal(
        "train", "language", "--nproc", "2", "--epochs", "2", "--batch-size", "16", "--out", "ref", "--tracker", "tensorboard", *COMMON,
        cwd=tmp_path, timeout=180,
    )  # fmt: skip
    assert ref.returncode == 0, ref.stderr
    config = json.loads((tmp_path / "ref" / "config.json").read_text())
    assert config["workload"] == "language" and config["optimizer"] == "adamw" and config["batch_size"] == 16
    first, second = _metrics(tmp_path / "ref")
    assert first["samples_seen"] == 512 and first["world_size"] == 2
    assert second["train_loss"] < first["train_loss"] - 0.5
    assert second["test_loss"] < first["test_loss"] < 0.6 * math.log(256)  # uniform bytes: ln 256
    for record in (first, second):  # test_loss is the exact mean over every test token
        assert record["test_bits_per_byte"] * math.log(2) == pytest.approx(record["test_loss"], rel=1e-9)
        assert 0 < record["test_accuracy"] < 1
        assert record["test_perplexity"] == pytest.approx(math.exp(record["test_loss"]), rel=1e-12)
        assert perplexity(record["test_loss"]) == math.exp(record["test_loss"]) < 256

    state = torch.load(tmp_path / "ref" / "model.pt", weights_only=True)
    model = TinyGPT.preset("tiny")
    model.load_state_dict(state)  # strict: every key and shape of the tiny preset
    model.eval()
    data = Language().load(_cfg(samples=512), torch.device("cpu"))
    with torch.no_grad():
        loss = float(lm_loss(model(data.test[0]), data.test[1]))
    assert loss == pytest.approx(second["test_loss"], rel=1e-5)  # the saved weights are the evaluated ones

    (ckpt,) = sorted((tmp_path / "ref" / "checkpoints").glob("ckpt-e00001-*.pt"))
    resumed = run_shoal(
        "train", "language", "--nproc", "1", "--epochs", "2", "--batch-size", "32", "--resume", str(ckpt),
        "--out", "resumed", *COMMON, cwd=tmp_path, timeout=180,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stdout and "epoch 2, step 16" in resumed.stdout, resumed.stdout
    (again,) = _metrics(tmp_path / "resumed")
    assert again["epoch"] == 2 and again["world_size"] == 1 and again["samples_seen"] == second["samples_seen"]
    assert again["test_loss"] == pytest.approx(second["test_loss"], rel=1e-5)
    b = torch.load(tmp_path / "resumed" / "model.pt", weights_only=True)
    assert state.keys() == b.keys()
    # The same windows in the same global batches; only the gradient sum's order differs, which
    # AdamW's g / sqrt(v) magnifies where g is near 0: at most 1% of one step (lr 0.01) apart.
    diffs = {key: float((state[key] - b[key]).abs().max()) for key in state}
    assert max(diffs.values()) < 1e-4, sorted(diffs.items(), key=lambda kv: -kv[1])[:3]
