"""The benchmarks' CUDA options the GPU check runs: nccl all-reduce within one GPU (``shoal bench
allreduce``), and the per-rank memory of FSDP2 in bf16 against DDP with the peak of GPU memory
(``python -m benchmarks.memory``; the CPU variant runs in CI)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT, run_shoal
from shoal.bench.allreduce import AllreduceConfig
from shoal.errors import ShoalError


def test_one_process_is_an_all_reduce_only_on_cuda():
    assert AllreduceConfig(nproc=1, device="cuda").nproc == 1
    with pytest.raises(ShoalError, match="at least 2 processes") as info:
        AllreduceConfig(nproc=1, device="cpu")
    assert "--device cuda" in info.value.hint


@pytest.mark.gpu
@pytest.mark.multiprocess
def test_nccl_all_reduce_within_one_gpu_against_a_device_copy(tmp_path):
    out = tmp_path / "ar.json"
    proc = run_shoal("bench", "allreduce", "--smoke", "--device", "cuda", "--nproc", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stderr + proc.stdout
    report = json.loads(out.read_text())
    assert report["config"]["backend"] == "nccl" and report["config"]["nproc"] == 1
    assert report["meta"]["machine"]["device"] == "cuda"
    for row in report["rows"]:
        assert row["busbw_gbps"] == 0.0  # one rank: no link crossed
        assert row["algbw_gbps"] > 0 and row["memcpy_gbps"] > 0
        assert row["algbw_vs_memcpy"] == pytest.approx(row["algbw_gbps"] / row["memcpy_gbps"])


@pytest.mark.multiprocess
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_memory_bench_in_bf16_reports_fsdp_against_ddp(tmp_path, device):
    out = tmp_path / "memory.json"
    argv = ["--smoke", "--world-sizes", "1", "--device", device, "--amp", "bf16", "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.memory", *argv], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    report = json.loads(out.read_text())
    assert report["config"]["amp"] == "bf16" and report["config"]["device"] == device
    rows = {r["strategy"]: r for r in report["rows"]}
    assert set(rows) == {"ddp", "fsdp"} and all(r["loss"] == r["loss"] for r in rows.values())
    # One rank: FSDP shards nothing, so its float32 state is DDP's, byte for byte.
    assert rows["fsdp"]["state_bytes"] == rows["ddp"]["state_bytes"]
    if device == "cuda":
        assert all(r["peak_device_bytes"] > r["state_bytes"] // 2 for r in rows.values())
        assert report["summary"][0]["peak_device_fsdp_vs_ddp"] > 0
        assert "peak GPU MB" in proc.stdout
    else:
        assert all(r["peak_device_bytes"] == 0 for r in rows.values())
