"""``python -m benchmarks.startup``: what is timed and how it is compared with torchrun (never its speed)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from benchmark_command import ROOT, run_benchmark

import warm
from benchmarks import startup
from shoal.errors import ShoalError
from shoal.launch.ports import find_free_port


def test_unknown_variant_is_a_clean_error():
    with pytest.raises(ShoalError, match="unknown startup variant"):
        startup.StartupConfig(variants=("torchrun", "mpirun"))


def test_missing_optional_launchers_are_skipped_with_a_note(monkeypatch, tmp_path: Path):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in ("accelerate", "lightning") else real(name, *a)
    )
    cfg = startup.StartupConfig(variants=("torchrun", "accelerate", "fabric"))
    commands, notes = startup._commands(cfg, tmp_path / "probe.py", tmp_path)
    assert list(commands) == ["torchrun"]
    assert len(notes) == 2 and all("is not installed" in n and "benchmarks/requirements.txt" in n for n in notes)


def test_commands_are_the_documented_ones(tmp_path: Path):
    cfg = startup.StartupConfig(nproc=3, variants=("torchrun", "shoal_run", "launch_fork", "train_digits"))
    commands, _ = startup._commands(cfg, tmp_path / "probe.py", tmp_path)
    torchrun = commands["torchrun"](tmp_path / "o").argv
    assert torchrun[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3"]
    assert commands["shoal_run"](tmp_path / "o").argv[1:6] == ["-m", "shoal", "run", "--nproc", "3"]
    assert "start_method" not in commands["launch_fork"](tmp_path / "o").argv[2]
    assert "'fork', 3" in commands["launch_fork"](tmp_path / "o").argv[2]
    digits = commands["train_digits"](tmp_path / "o")
    assert digits.line == "epoch 1/1" and digits.ranks == 0


@pytest.mark.multiprocess
def test_smoke_startup_report(tmp_path: Path):
    out = tmp_path / "startup.json"
    proc = run_benchmark("startup", "--smoke", "--json", str(out), timeout=240)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    report = json.loads(out.read_text())
    assert report["benchmark"] == "startup" and report["config"]["variants"] == ["torchrun", "shoal_run"]
    rows = {r["variant"]: r for r in report["rows"]}
    base = rows["torchrun"]["first_step_s"]
    assert rows["torchrun"]["vs_torchrun"] == pytest.approx(1.0)
    for r in rows.values():
        assert 0 < r["first_step_s"] <= r["exit_s"]
        assert r["cpu_s"] > 0.5  # at least two interpreters that import torch (the launcher, a worker)
        assert r["first_step_runs"] and r["vs_torchrun"] == pytest.approx(r["first_step_s"] / base)
        assert r["vs_torchrun_paired"] == pytest.approx(r["vs_torchrun"])  # one round: the same ratio
        assert r["failed_runs"] == 0
    assert "torch.distributed.run --standalone" in rows["torchrun"]["command"]
    assert " run --nproc 1 " in rows["shoal_run"]["command"]


@pytest.mark.multiprocess  # a launcher and its two forked workers
def test_function_probe_stamps_every_rank(tmp_path: Path, monkeypatch):
    """The launch_* variants run the probe file's own probe as a function entrypoint (forked workers),
    importing it from the repository root whatever the directory the benchmark was started in."""
    monkeypatch.chdir(tmp_path)
    cfg = startup.StartupConfig(nproc=2, variants=("launch_fork",))
    command = startup._commands(cfg, startup.PROBE, tmp_path)[0]["launch_fork"](tmp_path / "o")
    result = startup._run_once(command, tmp_path / "o")
    assert 0 < result["first_step_s"] <= result["exit_s"]
    stamps = [float((tmp_path / "o" / f"rank{r}.txt").read_text()) for r in (0, 1)]
    assert all(s > 0 for s in stamps)


def _stamps(out: Path, ranks: int, since: float) -> list[float]:
    stamps = [float((out / f"rank{r}.txt").read_text()) for r in range(ranks)]
    assert all(since < s < time.time() for s in stamps)
    return stamps


def test_the_probe_is_a_file_whose_import_costs_no_torch():
    """The launch_* variants import the probe in the parent that forks: it must not import torch there."""
    assert startup.PROBE.is_file() and startup.PROBE.suffix == ".py"
    code = "import sys, benchmarks.startup_probe as p; print(p.__file__, 'torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(startup.PROBE), "False"]


@pytest.mark.multiprocess
def test_probe_file_runs_as_a_script_of_one_rank(tmp_path: Path):
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(find_free_port()),
        "RANK": "0",
        "WORLD_SIZE": "1",
    }
    start = time.time()
    proc = subprocess.run(
        [sys.executable, str(startup.PROBE), str(tmp_path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    _stamps(tmp_path, 1, start)


@pytest.mark.multiprocess
def test_probe_file_runs_under_torchrun_on_every_rank(tmp_path: Path):
    start = time.time()
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    proc = warm.run([*argv, str(startup.PROBE), str(tmp_path)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    _stamps(tmp_path, 2, start)


def test_import_only_mode_stamps_one_process(tmp_path: Path):
    start = time.time()
    cmd = startup._commands(startup.StartupConfig(variants=("import_torch",)), startup.PROBE, tmp_path)[0]
    command = cmd["import_torch"](tmp_path)
    assert command.argv[1:] == [str(startup.PROBE), "--import-only", str(tmp_path)] and command.ranks == 1
    proc = subprocess.run(command.argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    _stamps(tmp_path, 1, start)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.txt"]
