"""``shoal bench scaling``: the report's structure and arithmetic (never its speed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_shoal
from shoal.bench.harness import paired_ratio
from shoal.bench.scaling import ScalingConfig, plan_launches
from shoal.bench.scaling_verdict import verdict
from shoal.bench.scaling_worker import Variant, _blocks
from shoal.cli.main import main


def test_plan_has_controls_and_equal_threads_on_cpu():
    cfg = ScalingConfig(world_sizes=(1, 2, 4), comm_hook=("bf16",))
    plan = plan_launches(cfg, [1, 2, 4], on_cpu=True)
    assert [v.name for v in plan[1]] == ["ddp", "threads:2", "threads:4"]
    # 1 process with T x threads also gets T x the batch: the same global batch as T processes.
    assert plan[1][2] == Variant("threads:4", 4, 128)
    assert [v.name for v in plan[2]] == ["ddp", "hook:bf16", "no_allreduce", "torch_defaults"]
    assert not plan[2][2].sync and plan[2][1].hook == "bf16"
    assert plan[2][3].torch_defaults and not plan[2][0].torch_defaults


def test_plan_on_gpu_has_no_thread_rows():
    plan = plan_launches(ScalingConfig(controls=False), [1, 2], on_cpu=False)
    assert {n: [v.name for v in vs] for n, vs in plan.items()} == {1: ["ddp"], 2: ["ddp"]}


@pytest.mark.parametrize(
    "steps, blocks, expected", [(20, 4, [5, 5, 5, 5]), (7, 3, [3, 2, 2]), (2, 4, [1, 1]), (5, 1, [5])]
)
def test_timed_steps_split_into_blocks(steps, blocks, expected):
    assert _blocks(steps, blocks) == expected


def test_comparisons_pair_runs_of_the_same_launch():
    # Launch 2 ran on a slow spell; the per-launch ratios (0.8, 0.8, 0.8) are what matters.
    a = [80.0, 40.0, 88.0]
    b = [100.0, 50.0, 110.0]
    assert paired_ratio(a, b) == pytest.approx(0.8)


def test_plan_across_nodes_has_every_hook_and_no_thread_rows():
    cfg = ScalingConfig(nnodes=2, node_rank=1, master_addr="10.0.0.1", comm_hook=("bf16", "powersgd"))
    plan = plan_launches(cfg, [1, 2], on_cpu=True)
    assert [v.name for v in plan[1]] == ["ddp"]
    assert [v.name for v in plan[2]] == ["ddp", "hook:bf16", "hook:powersgd", "no_allreduce"]


def test_verdict_names_the_bottleneck():
    comm = {"efficiency": 0.6, "efficiency_no_allreduce": 0.98, "allreduce_share": 0.39}
    assert verdict(2, comm)[0] == "communication-bound"
    contention = {"efficiency": 0.5, "efficiency_no_allreduce": 0.6, "allreduce_share": 0.17}
    assert verdict(2, contention)[0] == "contention-bound"
    # A busy machine halves even the control, but 76% of each step waits for the network: 4.2x vs 2.1x.
    slow_link = {"efficiency": 0.11, "efficiency_no_allreduce": 0.48, "allreduce_share": 0.76}
    assert verdict(2, slow_link)[0] == "communication-bound"
    assert (
        verdict(2, {"efficiency": 0.95, "efficiency_no_allreduce": 0.99, "allreduce_share": 0.04})[0] == "scales well"
    )


def test_verdict_says_which_hook_to_try_or_use():
    comm = {"efficiency": 0.3, "efficiency_no_allreduce": 0.9, "allreduce_share": 0.66}
    bound, text = verdict(2, comm, {"floats": 1000, "powersgd_floats": 25}, rank=2)
    assert bound == "communication-bound"
    assert text.endswith(
        "Try --comm-hook powersgd (low-rank, error feedback, rank 2 sends 2.5% of the float32 gradient bytes) "
        "or bf16 (half the bytes): measure them with --comm-hook bf16,powersgd"
    )
    measured = {
        **comm,
        "hook_gains": {"bf16": 0.4, "powersgd": 1.5},
        "efficiency_hooks": {"bf16": 0.42, "powersgd": 0.75},
    }
    text = verdict(2, measured)[1]
    assert "bf16 hook: +40.0% throughput (efficiency 0.42); powersgd hook: +150.0%" in text
    assert text.endswith("Use --comm-hook powersgd: +150% throughput here")
    useless = {**comm, "hook_gains": {"bf16": 0.01}, "efficiency_hooks": {"bf16": 0.3}}
    assert verdict(2, useless)[1].endswith("No hook pays here (none gains 5%): keep the plain all-reduce")
    # Not communication-bound and nothing measured: no advice.
    contention = {"efficiency": 0.5, "efficiency_no_allreduce": 0.6, "allreduce_share": 0.17}
    assert "comm-hook" not in verdict(2, contention, {"floats": 10, "powersgd_floats": 5})[1]
    assert "comm-hook" not in verdict(2, comm, {"floats": 1000, "powersgd_floats": 25}, advise=False)[1]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--arch", "vgg16"], "unknown architecture"),
        (["--comm-hook", "int8"], "unknown communication hook"),
        (["--comm-hook", "bf16,int8"], "unknown communication hook"),
        (["--powersgd-rank", "0"], "--powersgd-rank must be at least 1"),
        (["--nnodes", "2"], "needs --master-addr"),
        (["--nnodes", "2", "--master-addr", "a", "--node-rank", "2"], "--node-rank in 0..1"),
        (["--nnodes", "2", "--master-addr", "a", "--world-sizes", "1,4"], "--world-sizes does not go with --nnodes"),
        (["--batch-size", "0"], "--batch-size must be at least 1"),
        (["--world-sizes", "0,2"], "world sizes must be at least 1"),
    ],
)
def test_bad_options_fail_before_anything_starts(argv, expected, capsys):
    assert main(["bench", "scaling", "--smoke", *argv]) == 2
    err = capsys.readouterr().err
    assert expected in err and "HINT:" in err


def test_world_size_list_must_be_numbers(capsys):
    assert main(["bench", "scaling", "--world-sizes", "1,two"]) == 2
    err = capsys.readouterr().err
    assert "--world-sizes expected comma-separated integers" in err and "HINT: see `shoal bench scaling --help`" in err


@pytest.mark.multiprocess
def test_smoke_scaling_report(tmp_path: Path):
    out = tmp_path / "scaling.json"
    proc = run_shoal("bench", "scaling", "--smoke", "--comm-hook", "bf16,powersgd", "--json", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "1 proc x 1 thread" in proc.stdout and "efficiency" in proc.stdout
    report = json.loads(out.read_text())
    assert report["benchmark"] == "scaling"
    assert report["config"]["smoke"] is True and report["config"]["world_sizes"] == [1, 2]
    meta = report["meta"]
    assert meta["command"].startswith("shoal bench scaling --smoke")
    assert meta["machine"]["cores"] >= 1 and meta["machine"]["torch"]
    rows = {(r["world_size"], r["variant"]): r for r in report["rows"]}
    assert set(rows) == {
        (1, "ddp"),
        (1, "threads:2"),
        (2, "ddp"),
        (2, "hook:bf16"),
        (2, "hook:powersgd"),
        (2, "no_allreduce"),
        (2, "torch_defaults"),
    }
    base = rows[(1, "ddp")]["samples_per_s"]
    for r in report["rows"]:
        assert r["samples_per_s"] > 0 and all(v > 0 for v in r["samples_per_s_runs"])
        assert r["speedup"] == pytest.approx(r["samples_per_s"] / base)
        assert r["efficiency"] == pytest.approx(r["samples_per_s"] / (r["scale"] * base))
        assert r["time_reduction"] == pytest.approx(1 - base / r["samples_per_s"])
        assert r["step_s"] == pytest.approx(r["global_batch"] / r["samples_per_s"])
    two = rows[(2, "ddp")]
    assert two["scale"] == 2 and two["global_batch"] == 8 and two["total_threads"] == 2
    assert two["efficiency"] == pytest.approx(two["samples_per_s"] / (2 * base))
    (summary,) = report["summary"]
    assert summary["world_size"] == 2
    assert summary["bound"] in ("communication-bound", "contention-bound", "scales well")
    # Smoke runs once: the median of the per-launch ratios is that launch's ratio.
    assert summary["allreduce_share"] == pytest.approx(
        1 - two["samples_per_s"] / rows[(2, "no_allreduce")]["samples_per_s"]
    )
    for hook in ("bf16", "powersgd"):
        gain = rows[(2, f"hook:{hook}")]["samples_per_s"] / two["samples_per_s"] - 1
        assert summary["hook_gains"][hook] == pytest.approx(gain)
        assert summary["efficiency_hooks"][hook] == rows[(2, f"hook:{hook}")]["efficiency"]
    assert rows[(2, "hook:powersgd")]["label"] == "2 procs x 1 thread, powersgd hook"
    # ResNet-18's gradients, and what PowerSGD at rank 2 sends of them.
    assert report["model"]["floats"] == 11_181_642 and 0 < report["model"]["powersgd_floats"] < 11_181_642 // 10
    assert summary["processes_vs_threads"] == pytest.approx(
        two["samples_per_s"] / rows[(1, "threads:2")]["samples_per_s"]
    )
    assert summary["settings_gain"] == pytest.approx(
        two["samples_per_s"] / rows[(2, "torch_defaults")]["samples_per_s"] - 1
    )
    assert rows[(2, "torch_defaults")]["label"] == "2 procs x 1 thread, torch's DDP defaults"
    assert any(note.startswith("2 processes: efficiency") for note in report["notes"])
    # Its numbers mean nothing, so it advises nothing (it measured two hooks: else it would name one).
    assert not any("Use --comm-hook" in n or "No hook pays" in n or "Try --comm-hook" in n for n in report["notes"])
    assert Path(report["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # matplotlib: a test extra


@pytest.mark.gpu
@pytest.mark.multiprocess
def test_smoke_scaling_on_gpu(tmp_path: Path):
    out = tmp_path / "scaling.json"
    proc = run_shoal("bench", "scaling", "--smoke", "--device", "cuda", "--world-sizes", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stderr + proc.stdout
    report = json.loads(out.read_text())
    assert report["meta"]["machine"]["device"] == "cuda"
    assert [r["variant"] for r in report["rows"]] == ["ddp"]
    assert report["rows"][0]["samples_per_s"] > 0
