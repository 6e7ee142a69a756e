"""A user's own loop as replica groups (``shoal.run(fn, fault_tolerance=True)``, ``ctx.replicas``):
the groups' weights equal each other and, to float64 rounding, one process trained on the whole
global batch (the groups split each step's batch, torchft averages their gradients); the same for
groups of 2 processes that shard the model with FSDP2 (HSDP)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import procs
import warm

SCRIPT = str(Path(__file__).parent / "scripts" / "own_loop.py")
GROUP = str(Path(__file__).parent / "scripts" / "run_group.py")


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("shape", ["groups", "hsdp"])
def test_own_loop_replica_groups_train_as_one_process(shape):
    """``hsdp``: 2 groups of 2 processes, the model sharded by FSDP2 in each (``nproc_per_group=2``)."""
    args = [sys.executable, SCRIPT] + (["hsdp"] if shape == "hsdp" else [])
    done = warm.run(args, script=True, capture_output=True, text=True, timeout=240, env=procs.launcher_free_env())
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["groups"] == [0, 1] and report["steps"] == [20, 20], report
    assert report["hashes"][0] == report["hashes"][1], report
    assert report["max_diff"] < 1e-12, report


def test_replicas_outside_a_replica_group_says_how_to_start_one():
    from shoal.env.replica import replica_coordinates
    from shoal.errors import ShoalError

    with pytest.raises(ShoalError) as err:
        replica_coordinates({})
    assert "not started as a replica group" in err.value.message and "fault_tolerance=True" in err.value.hint


@pytest.mark.multiprocess
@pytest.mark.slow
def test_shoal_run_recipe_two_groups_by_hand(tmp_path):
    """docs/FAULT_TOLERANCE.md's recipe: a lighthouse, and each group its own ``shoal run --nproc 1``.

    Groups started by hand have no launcher to gather them before their first quorum: with
    ``--min_replicas 2`` every quorum holds both (a group that finished its 10 steps before the
    other started would otherwise have trained alone)."""
    from shoal.train.ft.lighthouse import Lighthouse

    ready = tmp_path / "ready"  # each group's file once it has started (scripts/run_group.py)
    ready.mkdir()
    with Lighthouse(min_replicas=2) as lighthouse:
        started = [
            procs.start("run", "--nproc", "1", GROUP, env=procs.launcher_free_env(
                SHOAL_REPLICA_GROUP=str(group), SHOAL_REPLICA_GROUPS="2", TORCHFT_LIGHTHOUSE=lighthouse.url,
                TORCHFT_QUORUM_RETRIES="10", RUST_LOG="warn", READY_DIR=str(ready)))
            for group in (0, 1)
        ]  # fmt: skip
        try:
            outputs = [proc.communicate(timeout=180) for proc in started]
        finally:
            for proc in started:
                procs.kill_group(proc)
    for proc, (_, stderr) in zip(started, outputs):
        assert proc.returncode == 0, stderr[-3000:]
    reports = [json.loads(stdout.strip().splitlines()[-1]) for stdout, _ in outputs]
    assert [r["group"] for r in reports] == [0, 1] and {r["step"] for r in reports} == {10}, reports
    assert reports[0]["hash"] == reports[1]["hash"], reports


@pytest.mark.multiprocess
def test_fit_with_fault_tolerance_returns_group_zeros_result(tmp_path):
    script = str(Path(__file__).parent / "scripts" / "fit_ft.py")
    done = warm.run([sys.executable, script, str(tmp_path / "run")], script=True, capture_output=True, text=True,
                    timeout=240, env=procs.launcher_free_env())  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    (record,) = result["metrics"]
    assert record["replica_groups"] == 2 and record["participants"][0] == 2, record
    assert record["test_accuracy"] > 0.5 and Path(result["model"]).is_file(), result
