"""``shoal.fit``: ``shoal train`` as a Python call, here or on workers it starts itself."""

from __future__ import annotations

import json
import sys

import pytest

import shoal
import warm
from shoal.errors import ShoalError

FIT_TWO_WORKERS = """
import json, sys
import shoal

result = shoal.fit("digits", nproc=2, epochs=2, device="cpu", out=sys.argv[1], progress=False)
print("RESULT " + json.dumps({
    "run_dir": str(result.run_dir), "model": str(result.model_path), "accuracies": result.accuracies,
    "world": [m["world_size"] for m in result.metrics], "epochs": result.config.epochs,
    "lr": result.config.lr,
}), flush=True)
"""


def test_fit_in_this_process_returns_metrics_model_and_config(tmp_path):
    result = shoal.fit("digits", epochs=2, out=str(tmp_path / "run"), progress=False, device="cpu")
    assert result.run_dir == tmp_path / "run" and result.model_path == tmp_path / "run" / "model.pt"
    assert result.model_path.is_file()
    assert [m["epoch"] for m in result.metrics] == [1, 2] and len(result.accuracies) == 2
    assert result.accuracies == json.loads((tmp_path / "run" / "accuracies.json").read_text())
    assert result.accuracies[-1] > 0.7
    assert result.config.epochs == 2 and result.config.lr == 0.05  # the workload's default, resolved


@pytest.mark.multiprocess
def test_fit_starts_its_own_workers(tmp_path):
    cmd = [sys.executable, "-c", FIT_TWO_WORKERS, str(tmp_path / "run")]
    proc = warm.run(
        cmd, script=True, capture_output=True, text=True, timeout=300
    )  # the driver's start-up is not the point
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    assert result["run_dir"] == str(tmp_path / "run") and result["world"] == [2, 2]
    assert len(result["accuracies"]) == 2 and result["epochs"] == 2 and result["lr"] == 0.05
    assert (tmp_path / "run" / "model.pt").is_file()


def test_unknown_options_and_bad_values_are_shoal_errors(tmp_path):
    with pytest.raises(ShoalError, match="unknown option.*epoch_count") as info:
        shoal.fit("digits", epoch_count=3)
    assert "epochs=3" in info.value.hint
    with pytest.raises(ShoalError, match="--nproc must be at least 1"):
        shoal.fit("digits", nproc=0)
    with pytest.raises(ShoalError, match="unknown workload"):
        shoal.fit("imagenet", out=str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()
