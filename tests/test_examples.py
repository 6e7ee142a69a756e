"""The README's examples run as written: examples/shoal_digits.py (the library) under ``python``,
``shoal run`` and torchrun, and examples/ddp_digits.py (the plain DDP script it was ported from)
under ``shoal run``. One epoch each on scikit-learn's digits; every run saves a plain state dict."""

from __future__ import annotations

import re
import sys

import pytest
import torch

import warm
from conftest import ROOT, shoal_cmd

PORT = ROOT / "examples" / "shoal_digits.py"
DDP = ROOT / "examples" / "ddp_digits.py"
EPOCH_LINE = re.compile(r"^epoch 0: test loss \d+\.\d{3}, accuracy (\d\.\d{3}) \((\d+) test samples\)$", re.M)
TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")


def run_example(cmd: list[str], out, *, script: bool = False):
    """Run ``cmd SCRIPT --epochs 1 --out OUT`` warm (tests/warm.py); return (accuracy, test samples, state dict)."""
    result = warm.run([*cmd, "--epochs", "1", "--out", str(out)], capture_output=True, text=True, timeout=240,
                      script=script, cwd=out.parent)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    (match,) = EPOCH_LINE.findall(result.stdout)  # printed once: by rank 0 only
    state = torch.load(out / "model.pt", weights_only=True)
    return float(match[0]), int(match[1]), state


@pytest.mark.parametrize(
    "launcher",
    [
        pytest.param((sys.executable,), id="python"),
        pytest.param((*shoal_cmd("run", "--nproc", "2"),), id="shoal-run", marks=pytest.mark.multiprocess),
        pytest.param(TORCHRUN, id="torchrun", marks=pytest.mark.multiprocess),
    ],
)
def test_the_port_runs_as_written(launcher, tmp_path):
    accuracy, samples, state = run_example([*launcher, str(PORT)], tmp_path / "out", script=len(launcher) == 1)
    assert samples == 297  # every test sample once, whatever the world size
    assert accuracy > 0.5
    assert sorted(state) == ["0.bias", "0.weight", "2.bias", "2.weight"]  # unwrapped: no "module." prefix


def test_the_readme_shows_the_port_as_it_is():
    code = PORT.read_text().split('"""', 2)[2].strip()  # the file without its docstring
    assert f"```python\n{code}\n```" in (ROOT / "README.md").read_text()


@pytest.mark.multiprocess
def test_the_plain_ddp_script_runs_under_shoal_run(tmp_path):
    accuracy, samples, state = run_example([*shoal_cmd("run", "--nproc", "2"), str(DDP)], tmp_path / "out")
    assert samples == 298  # DistributedSampler pads 297 to a multiple of 2: what ctx.eval_loader avoids
    assert accuracy > 0.5
    assert sorted(state) == ["0.bias", "0.weight", "2.bias", "2.weight"]
