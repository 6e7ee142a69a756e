"""``make test-gpu`` (scripts/gpu/check.py) on a machine without a GPU: its dry run, its refusal, and a
rehearsal of its benchmark set on the CPU that writes the whole report (the pipeline the GPU day
depends on, exercised here so a slip in it costs no lent GPU minutes)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from conftest import ROOT

CHECK = ROOT / "scripts" / "gpu" / "check.py"
STEPS = ["train", "ddp-plain-1", "ddp-library-1", "ddp-loader-1", "allreduce", "memory"]
needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")


def _check(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CHECK), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


@pytest.mark.slow
def test_dry_run_lists_every_step_and_finds_every_part_runnable():
    proc = _check("--dry-run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for name in ["tests", *STEPS, "ddp-plain-2"]:
        assert f"\n{name}: " in "\n" + out, name
    assert "python -m pytest -m gpu -o addopts= --strict-markers" in out  # no xdist, timeout or addopts assumed
    collected = [line.strip() for line in out.splitlines() if line.startswith("  tests/")]
    assert "tests/distributed/test_device.py::test_auto_picks_the_local_gpu" in collected
    assert "tests/gpu/test_cuda_paths.py::test_two_spawned_workers_share_one_gpu_over_gloo" in collected
    assert "tests/train/ft/test_ft_devices.py::test_spawned_groups_lose_one_step_and_heal[cuda]" in collected
    assert all("[cpu]" not in test_id for test_id in collected)  # -m gpu: the CPU variants stay out
    assert out.rstrip().endswith("all runnable")


@needs_no_cuda
def test_without_cuda_it_says_so_in_one_line_and_fails(tmp_path):
    proc = _check("--out", str(tmp_path / "report"), timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("gpu-check: no CUDA here (") and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "report").exists()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_rehearsal_on_the_cpu_writes_the_report_with_every_figure_against_its_baseline(tmp_path):
    out = tmp_path / "report"
    proc = _check("--rehearse", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "gpu-report.json").read_text())
    assert report["rehearsal"] is True and report["machine"]["torch"] == torch.__version__
    assert [s["name"] for s in report["steps"]] == STEPS
    assert all(s["status"] == "ok" for s in report["steps"]) and (out / "logs" / "memory.log").is_file()
    names = [f["name"] for f in report["figures"]]
    assert any("training throughput" in n for n in names) and any("ctx.wrap" in n for n in names)
    assert any("waiting on data" in n for n in names) and any("FSDP2" in n for n in names)
    assert sum("all-reduce algbw" in n for n in names) == 3  # --smoke: three message sizes
    for figure in report["figures"]:
        assert figure["baseline"] > 0 and math.isfinite(figure["ratio"]), figure
        assert figure["command"] and figure["baseline_command"]
    markdown = (out / "gpu-report.md").read_text()
    assert markdown.startswith("# GPU check: REHEARSAL") and "| figure | measured | baseline |" in markdown
