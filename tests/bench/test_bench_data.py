"""``python -m benchmarks.data``: the three loaders are measured on the same data (never their speed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmark_command import run_benchmark

from benchmarks.data import BENCHMARK, DataConfig, write_fake_mnist
from shoal.errors import ShoalError


def _check_report(report: dict) -> None:
    assert report["benchmark"] == "data"
    rows = {r["variant"]: r for r in report["rows"]}
    assert set(rows) == {"shoal", "per_sample", "slicing", "index_select"}
    for r in rows.values():
        assert r["samples_per_s"] > 0 and r["setup_s"] >= 0
        assert r["vs_per_sample"] == pytest.approx(r["samples_per_s"] / rows["per_sample"]["samples_per_s"])
        assert r["vs_slicing"] == pytest.approx(r["samples_per_s"] / rows["slicing"]["samples_per_s"])
    assert report["shoal_batch_shape"] == [report["config"]["batch_size"], 1, 28, 28]


def test_fake_mnist_reads_as_torchvision_mnist(tmp_path: Path):
    from torchvision.datasets import MNIST

    write_fake_mnist(tmp_path, 100)
    ds = MNIST(str(tmp_path), train=True, download=False)
    assert tuple(ds.data.shape) == (100, 28, 28) and len(ds.targets) == 100
    assert int(ds.targets.max()) <= 9


def test_missing_data_dir_is_a_clean_error(tmp_path: Path):
    with pytest.raises(ShoalError, match="MNIST not found"):
        BENCHMARK.run(DataConfig(data=str(tmp_path)), log=lambda _: None)


def test_bad_batch_size():
    with pytest.raises(ShoalError, match="--batch-size must be at least 1"):
        DataConfig(batch_size=0)


def test_smoke_data_report_through_the_cli(tmp_path: Path):
    out = tmp_path / "data.json"
    proc = run_benchmark("data", "--smoke", "--json", str(out), timeout=120)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "per_sample" in proc.stdout and "slicing" in proc.stdout
    report = json.loads(out.read_text())
    _check_report(report)
    assert report["config"]["samples"] == 1024 and report["config"]["threads"] == 1
    assert "random uint8" in report["config"]["source"]


def test_smoke_on_real_mnist(mnist_root: Path):
    import torch

    threads = torch.get_num_threads()
    cfg = BENCHMARK.configure(smoke=True, data=str(mnist_root))
    report = BENCHMARK.run(cfg, log=lambda _: None, argv=["python", "-m", "benchmarks.data"])
    assert torch.get_num_threads() == threads  # the caller's thread count is left alone
    _check_report(report)
    assert report["config"]["dataset_size"] == 60000 and "real MNIST" in report["config"]["source"]
