"""``python -m benchmarks.checkpoint``: every variant saves and loads the same state, checked (never its speed)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from benchmark_command import run_benchmark

from benchmarks.checkpoint import BENCHMARK, VARIANTS, CheckpointConfig
from benchmarks.checkpoint_state import build_state, same
from shoal.atomic import TMP_PREFIX
from shoal.errors import ShoalError


def _check_report(report: dict) -> None:
    assert report["benchmark"] == "checkpoint"
    assert report["verified"] is True
    rows = {r["variant"]: r for r in report["rows"]}
    assert list(rows) == list(VARIANTS)
    for r in rows.values():
        assert r["verified"] is True
        assert r["bytes"] > 0 and r["save_s"] > 0 and r["load_s"] > 0
        assert r["save_mbps"] > 0 and r["load_mbps"] > 0
        assert r["save_mbps"] == pytest.approx(r["bytes"] / 1e6 / r["save_s"])
        assert r["load_mbps"] == pytest.approx(r["bytes"] / 1e6 / r["load_s"])
        assert len(r["save_s_runs"]) == len(r["load_s_runs"]) == report["config"]["repeat"]
        assert r["vs_torch_save"] == pytest.approx(r["save_mbps"] / rows["torch_save"]["save_mbps"])
        assert r["vs_torch_save_fsync"] == pytest.approx(r["save_mbps"] / rows["torch_save_fsync"]["save_mbps"])
    assert rows["torch_save"]["vs_torch_save"] == pytest.approx(1.0)
    # The same state in every file; the manager's adds RNG states and metadata.
    assert rows["torch_save"]["bytes"] >= report["config"]["state_bytes"]
    assert rows["shoal_manager"]["bytes"] > rows["shoal_atomic"]["bytes"]
    assert report["verdict"] == (
        f"shoal atomic save: {rows['shoal_atomic']['vs_torch_save']:.2f}x plain torch.save (target >= 0.8x)"
    )
    # What was on disk at the end: one file per plain variant, the manager's newest checkpoint and its
    # pointer (retention removed the older ones), and no temporary left by an atomic write.
    files = report["files"]
    assert not any(Path(f).name.startswith(TMP_PREFIX) for f in files), files
    manager_files = sorted(f for f in files if f.startswith("manager/"))
    assert len(manager_files) == 2 and manager_files[1] == "manager/latest"
    assert manager_files[0].startswith("manager/ckpt-") and manager_files[0].endswith(".pt")
    assert sorted(f for f in files if not f.startswith("manager/")) == sorted(f"{v}.pt" for v in VARIANTS[:3])
    assert isinstance(report["meta"]["load_average_end"], float) and report["meta"]["load_average_end"] >= 0
    fs = report["config"]["filesystem"]
    assert fs["mount"] and fs["type"] and fs["device"]


def test_smoke_run_in_a_given_directory(tmp_path: Path):
    state = random.getstate()
    lines: list[str] = []
    report = BENCHMARK.run(
        BENCHMARK.configure(smoke=True, directory=str(tmp_path)),
        log=lines.append,
        argv=["python", "-m", "benchmarks.checkpoint", "--smoke"],
    )
    _check_report(report)
    assert report["config"]["model"] == "mb:2" and report["config"]["state_bytes"] == 2_000_000
    assert report["config"]["tensors"] == 100
    assert report["config"]["directory"] == str(tmp_path)
    assert Path(report["config"]["path"]).parent == tmp_path
    assert list(tmp_path.iterdir()) == []  # everything written was removed
    assert len(lines) == 2 and all("save MB/s" in line for line in lines)
    assert random.getstate() == state  # capturing RNG states leaves them alone

    text = BENCHMARK.format(report)
    for variant in VARIANTS:
        assert variant in text
    assert report["verdict"] in text.splitlines()
    assert "shoal atomic save: " in text and "plain torch.save (target >= 0.8x)" in text
    assert "page cache" in text and str(tmp_path) in text


def test_torchvision_state_includes_the_optimizer():
    import torch

    rng = torch.get_rng_state()
    state, objects, described = build_state("resnet18")
    assert torch.equal(torch.get_rng_state(), rng)  # the caller's RNG is left alone
    assert set(state) == {"model", "optimizer"} and set(objects) == {"model", "optimizer"}
    momentum = [s["momentum_buffer"] for s in state["optimizer"]["state"].values()]
    params = list(objects["model"].parameters())
    assert len(momentum) == len(params) and sum(m.numel() for m in momentum) == sum(p.numel() for p in params)
    assert "resnet18" in described and "SGD" in described


def test_same_detects_a_changed_tensor():
    import torch

    a = {"model": {"w": torch.arange(4.0)}, "optimizer": {"param_groups": [{"lr": 0.1}]}}
    b = {"model": {"w": torch.arange(4.0)}, "optimizer": {"param_groups": [{"lr": 0.1}]}}
    assert same(a, b)
    b["model"]["w"][2] = 7.0
    assert not same(a, b)
    assert not same(a, {"model": {"w": torch.arange(4.0)}})
    assert not same({"w": torch.arange(4)}, {"w": torch.arange(4.0)})  # dtype differs


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(repeat=0), "--repeat must be at least 1"),
        (dict(warmup=-1), "--warmup at least 0"),
        (dict(model="resnet9000"), "unknown model 'resnet9000'"),
        (dict(model="mb:0"), "positive number of MB"),
        (dict(model="mb:lots"), "positive number of MB"),
    ],
)
def test_bad_config_is_a_clean_error(kwargs: dict, match: str):
    with pytest.raises(ShoalError, match=match) as err:
        CheckpointConfig(**kwargs)
    assert err.value.hint


def test_missing_directory_is_a_clean_error(tmp_path: Path):
    with pytest.raises(ShoalError, match="is not an existing directory") as err:
        BENCHMARK.configure(smoke=True, directory=str(tmp_path / "nowhere"))
    assert "create it" in err.value.hint


def test_smoke_overrides_win():
    cfg = BENCHMARK.configure(smoke=True, repeat=3)
    assert (cfg.model, cfg.repeat, cfg.warmup) == ("mb:2", 3, 0)
    assert CheckpointConfig() == CheckpointConfig(model="resnet18", directory=None, repeat=5, warmup=1)


def test_smoke_checkpoint_report_through_its_command_with_a_flag_that_wins(tmp_path: Path):
    out = tmp_path / "c.json"
    work = tmp_path / "disk"
    work.mkdir()
    argv = ["--smoke", "--repeat", "3", "--dir", str(work), "--json", str(out)]
    proc = run_benchmark("checkpoint", *argv, timeout=120)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "shoal atomic save: " in proc.stdout and "shoal_manager" in proc.stdout
    assert "python -m benchmarks.checkpoint (smoke: tiny sizes, the numbers mean nothing)" in proc.stderr
    report = json.loads(out.read_text())
    _check_report(report)
    cfg = report["config"]
    assert (cfg["smoke"], cfg["model"], cfg["repeat"], cfg["warmup"]) == (True, "mb:2", 3, 0)
    assert cfg["directory"] == str(work) and list(work.iterdir()) == []
    assert report["meta"]["command"] == "python -m benchmarks.checkpoint " + " ".join(argv)


def test_bad_input_is_one_line_and_a_hint():
    proc = run_benchmark("checkpoint", "--repeat", "0", timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "shoal: error: --repeat must be at least 1 and --warmup at least 0, got 0 and 1",
        "HINT: pass e.g. --repeat 5 --warmup 1",
    ]
