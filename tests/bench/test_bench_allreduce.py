"""``shoal bench allreduce``: nccl-tests' definitions hold in the report (never its speed)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from conftest import run_shoal
from shoal.bench.allreduce import AllreduceConfig
from shoal.bench.report import parse_size
from shoal.cli.main import main
from shoal.errors import ShoalError


def test_default_sizes_are_4k_to_256m_by_4():
    sizes = AllreduceConfig().sizes()
    assert sizes[0] == 4096 and sizes[-1] == 256 * 2**20
    assert all(b == 4 * a for a, b in zip(sizes, sizes[1:]))


def test_sizes_are_whole_elements():
    assert AllreduceConfig(min_bytes=6, max_bytes=100, factor=2, dtype="float32").sizes() == [4, 12, 24, 48, 96]


@pytest.mark.parametrize(
    "text, value", [("4096", 4096), ("4K", 4096), ("4kb", 4096), ("256M", 256 * 2**20), ("1G", 2**30)]
)
def test_size_flags(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["four", "4X", "0"])
def test_bad_size_flags(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size(text)


def test_one_process_is_refused():
    with pytest.raises(ShoalError, match="at least 2 processes"):
        AllreduceConfig(nproc=1)


def test_bad_dtype_is_a_clean_error(capsys):
    assert main(["bench", "allreduce", "--dtype", "int3"]) == 2
    assert "unknown dtype" in capsys.readouterr().err


def _check_report(report: dict, nproc: int) -> None:
    assert report["benchmark"] == "allreduce"
    cfg = report["config"]
    assert cfg["nproc"] == nproc and cfg["backend"] in ("gloo", "nccl")
    assert [r["bytes"] for r in report["rows"]] == cfg["sizes"]
    factor = 2 * (nproc - 1) / nproc
    assert report["busbw_factor"] == pytest.approx(factor)
    for r in report["rows"]:
        assert r["time_us"] > 0 and r["iters"] >= 1 and r["memcpy_iters"] >= 1
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / (r["time_us"] * 1e-6) / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * factor)
        assert r["memcpy_gbps"] > 0
        assert r["busbw_vs_memcpy"] == pytest.approx(r["busbw_gbps"] / r["memcpy_gbps"])


@pytest.mark.multiprocess
def test_smoke_allreduce_report(tmp_path: Path):
    out = tmp_path / "ar.json"
    proc = run_shoal("bench", "allreduce", "--smoke", "--nproc", "2", "--json", str(out), timeout=180)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "busbw GB/s" in proc.stdout and "memcpy GB/s" in proc.stdout
    report = json.loads(out.read_text())
    assert report["config"]["sizes"] == [4096, 65536, 2**20]
    _check_report(report, 2)


@pytest.mark.gpu
@pytest.mark.multiprocess
def test_smoke_allreduce_on_gpu(tmp_path: Path):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    out = tmp_path / "ar.json"
    proc = run_shoal("bench", "allreduce", "--smoke", "--device", "cuda", "--nproc", "2", "--json", str(out))
    assert proc.returncode == 0, proc.stderr + proc.stdout
    report = json.loads(out.read_text())
    assert report["config"]["backend"] == "nccl"
    _check_report(report, 2)
