"""``python -m benchmarks.overhead``: the same job through a plain DDP loop, shoal's trainer, the peers and shoal.horovod.

What is checked is the machinery and the correctness claim (shoal's trainer ends with weights
bit-identical to the hand-written DDP loop), never speed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from benchmark_command import ROOT, run_benchmark

import warm
from benchmarks import overhead, overhead_workers
from benchmarks.peers import PEERS
from shoal.errors import ShoalError


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"model": "vgg"}, "unknown model"),
        ({"repeat": 0}, "--repeat must be at least 1"),
        ({"epochs": 2, "warmup": 2}, "leaves no timed epoch"),
        ({"variants": ("plain", "deepspeed")}, "unknown variant"),
        ({"start_method": "forkserver"}, "unknown start method"),
    ],
)
def test_bad_options_are_clean_errors(kwargs, match):
    with pytest.raises(ShoalError, match=match) as err:
        overhead.OverheadConfig(**kwargs)
    assert err.value.hint


def test_plain_loop_schedule_is_shoal_schedule():
    """The plain loop's lr is written by hand; it must be the trainer's schedule, float for float."""
    from shoal.train.optim import LRSchedule

    job = overhead_workers.Job("mlp", 8, 8, 64, 3, 1, "unused")
    schedule = LRSchedule(job.lr, job.epochs, 0.0)
    for epoch in range(job.epochs):
        for step in range(4):
            assert overhead_workers.cosine_lr(job, epoch + step * 16 / 64) == schedule.at(epoch + step * 16 / 64)


def test_peers_are_kept_when_installed_and_skipped_with_a_note_when_not(monkeypatch):
    from benchmarks.peers import skip_missing_peers

    installed = [v for v, package in PEERS.items() if importlib.util.find_spec(package) is not None]
    kept, notes = skip_missing_peers(["plain", *installed])
    assert kept == ["plain", *installed] and notes == []
    # A framework that is really not installed (no such package exists).
    monkeypatch.setitem(PEERS, "fabric", "shoal_test_no_such_package")
    kept, notes = skip_missing_peers(["plain", "fabric", "shoal"])
    assert kept == ["plain", "shoal"]
    assert notes == [
        "fabric: skipped, shoal_test_no_such_package is not installed (pip install -r benchmarks/requirements.txt)"
    ]


@pytest.mark.multiprocess
def test_smoke_overhead_report_with_bit_identical_weights(tmp_path: Path):
    out = tmp_path / "overhead.json"
    variants = ["plain", "shoal"] + [v for v, pkg in PEERS.items() if importlib.util.find_spec(pkg)] + ["horovod"]
    # Two rounds: the second forks workers again after the first round's results came back, which
    # is where a parent that had run torch ops would hang (the report would never be written).
    proc = run_benchmark(
        "overhead",
        "--smoke",
        "--repeat",
        "2",
        "--variants",
        ",".join(variants),
        "--json",
        str(out),
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    report = json.loads(out.read_text())
    assert report["benchmark"] == "overhead" and report["config"]["variants"] == variants
    rows = {r["variant"]: r for r in report["rows"]}
    assert list(rows) == variants
    assert rows["plain"]["vs_plain"] == pytest.approx(1.0) and rows["plain"]["vs_plain_paired"] == pytest.approx(1.0)
    for r in rows.values():
        assert r["step_ms"] > 0 and len(r["step_ms_runs"]) == 2
        assert r["vs_plain"] == pytest.approx(r["step_ms"] / rows["plain"]["step_ms"])
        assert r["paired_min"] <= r["vs_plain_paired"] <= r["paired_max"]
    # The claim: shoal's trainer does exactly what the hand-written DDP loop does.
    assert report["weights"]["shoal"] == {"identical": True, "same_every_round": True, "max_abs_diff": 0.0}
    for peer in variants[2:]:
        assert report["weights"][peer]["max_abs_diff"] < 1e-4  # same math; other frameworks may round differently
    assert "bit-identical weights in every round" in proc.stdout
    assert "shoal / plain DDP step time" in proc.stdout
    # shoal.horovod's DistributedOptimizer averages what DDP averages: the same weights, to float rounding.
    assert "horovod / plain: " in proc.stdout and "horovod" in report["weights"]


# Both jobs from one fresh interpreter that forks their workers, as benchmarks/overhead.py does on CPU
# (not from pytest, whose earlier tests may have started an OpenMP pool a forked worker would hang in).
TWO_JOBS = """
import json, sys
from pathlib import Path

from benchmarks import overhead, overhead_workers
from shoal.bench.harness import launch_workers

overhead._preimport(["plain"])  # what measure() imports once before it forks workers, and
import torch._dynamo  # what each worker's optimizer would import (torch.optim.Optimizer.__init__)
results = []
for name, seed in (("a", 0), ("b", 1)):
    job = overhead_workers.Job("mlp", 8, 8, 32, 1, 1, str(Path(sys.argv[1]) / name), seed=seed)
    Path(job.out).mkdir()
    results.append(launch_workers(overhead_workers.plain_worker, (job,), 2, "fork"))
print("RESULTS " + json.dumps(results), flush=True)
"""


@pytest.mark.multiprocess
def test_a_different_job_is_detected(tmp_path: Path):
    """The check can fail: two different jobs do not end with the same digest."""
    env = {k: v for k, v in os.environ.items() if k != "SHOAL_ENV"}
    cmd = [sys.executable, "-c", TWO_JOBS, str(tmp_path)]
    proc = warm.run(cmd, script=True, capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("RESULTS ")]
    results = json.loads(line.removeprefix("RESULTS "))
    assert results[0]["digest"] != results[1]["digest"]
    assert overhead.largest_difference(results[0]["weights"], results[1]["weights"]) > 0
