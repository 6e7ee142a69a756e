"""``shoal train --comm-hook bf16|fp16``: DDP all-reduces the gradients compressed; bad names refused."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import run_shoal
from shoal.errors import ShoalError
from shoal.train.config import TrainConfig


def _run(out, hook: str):
    return run_shoal(
        "train",
        "digits",
        "--nproc",
        "2",
        "--epochs",
        "2",
        "--device",
        "cpu",
        "--seed",
        "0",
        "--comm-hook",
        hook,
        "--out",
        str(out),
        timeout=240,
    )


@pytest.mark.multiprocess
@pytest.mark.slow
def test_bf16_hook_runs_and_still_learns(tmp_path):
    """Same seed, same data order: only the hook differs, so different weights prove it ran."""
    plain = _run(tmp_path / "none", "none")
    assert plain.returncode == 0, plain.stderr + plain.stdout
    assert "comm hook" not in plain.stdout
    bf16 = _run(tmp_path / "bf16", "bf16")
    assert bf16.returncode == 0, bf16.stderr + bf16.stdout
    assert "comm hook bf16: gradients all-reduced in bfloat16" in bf16.stdout
    for name in ("none", "bf16"):
        out = tmp_path / name
        metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert len(metrics) == 2 and metrics[-1]["test_accuracy"] > 0.8, (name, metrics)
        assert json.loads((out / "config.json").read_text())["comm_hook"] == name
    a = torch.load(tmp_path / "none" / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "bf16" / "model.pt", weights_only=True)
    assert a.keys() == b.keys()
    assert max((a[k] - b[k]).abs().max().item() for k in a) > 0


def test_bad_comm_hook_is_one_line_with_hint(tmp_path):
    out = tmp_path / "out"
    result = run_shoal("train", "digits", "--nproc", "2", "--comm-hook", "int8", "--out", str(out), timeout=60)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith("shoal: error: --comm-hook") and "'int8'" in lines[0], result.stderr
    assert lines[1].startswith("HINT: ") and "bf16" in lines[1], result.stderr
    assert not out.exists()


@pytest.mark.parametrize("hook", ["none", "bf16", "fp16"])
def test_config_accepts_known_hooks(hook):
    assert TrainConfig(comm_hook=hook).comm_hook == hook


def test_config_refuses_unknown_hook():
    with pytest.raises(ShoalError) as caught:
        TrainConfig(comm_hook="bf8")
    assert "--comm-hook" in caught.value.message and caught.value.hint
