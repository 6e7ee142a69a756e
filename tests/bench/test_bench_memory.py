"""``python -m benchmarks.memory``: per-rank bytes under DDP and FSDP, counted from real ranks (never their speed)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from benchmark_command import ROOT, run_benchmark

from benchmarks.memory import BENCHMARK, MemoryConfig
from shoal.errors import ShoalError
from shoal.workloads.language_model import PRESETS


@pytest.mark.multiprocess
def test_smoke_run_counts_what_each_rank_holds(tmp_path):
    out = tmp_path / "memory.json"
    proc = run_benchmark("memory", "--smoke", "--json", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["benchmark"] == "memory" and report["config"]["smoke"] is True
    n = PRESETS["tiny"].n_params
    assert report["config"]["n_params"] == n == 43_136
    rows = {(r["world_size"], r["strategy"]): r for r in report["rows"]}
    assert sorted(rows) == [(1, "ddp"), (1, "fsdp"), (2, "ddp"), (2, "fsdp")]
    tensors = 30  # Adam keeps a float32 ``step`` tensor per parameter tensor besides its two moments
    for key in [(1, "ddp"), (1, "fsdp"), (2, "ddp")]:  # the whole model on every rank
        r = rows[key]
        assert r["params_bytes"] == r["grads_bytes"] == 4 * n, key
        assert r["optim_bytes"] == 8 * n + 4 * tensors, key
        assert r["state_bytes"] == 16 * n + 4 * tensors
    # FSDP at 2 ranks: each rank about half (dim-0 shards are padded to equal sizes, the step
    # tensors are whole on every rank).
    fsdp = rows[(2, "fsdp")]
    assert 2 * n <= fsdp["params_bytes"] < 2 * n + 4 * 32 * tensors
    assert fsdp["grads_bytes"] == fsdp["params_bytes"]
    assert len(fsdp["per_rank_state_bytes"]) == 2
    summary = {s["world_size"]: s for s in report["summary"]}
    assert summary[2]["bytes_fsdp_vs_ddp"] == pytest.approx(fsdp["state_bytes"] / rows[(2, "ddp")]["state_bytes"])
    assert summary[2]["bytes_fsdp_vs_ddp"] < 0.55 and summary[2]["target_met"] is True
    assert summary[1]["bytes_fsdp_vs_ddp"] == 1.0 and summary[1]["target"] is None
    assert all(s["step_fsdp_vs_ddp"] > 0 for s in report["summary"])
    for r in report["rows"]:
        assert r["peak_rss"] > r["rss_growth"] > 0 and r["step_s"] > 0 and r["loss"] > 0
    assert "2 rank(s): FSDP holds 0.5" in proc.stdout and "(target <= 0.55: met)" in proc.stdout
    assert "vs DDP" in proc.stdout


def test_bad_config_is_one_line_with_a_hint():
    with pytest.raises(ShoalError, match="unknown model 'huge'") as err:
        BENCHMARK.configure(model="huge")
    assert "--model tiny" in err.value.hint
    with pytest.raises(ShoalError, match="world sizes must be at least 1"):
        MemoryConfig(world_sizes=(0, 2))
    with pytest.raises(ShoalError, match="--steps must be at least 1"):
        MemoryConfig(steps=0)
    assert BENCHMARK.configure(smoke=True).world_sizes == (1, 2)


def test_importing_the_benchmark_imports_no_torch():
    code = "import sys, benchmarks.memory; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=ROOT)
