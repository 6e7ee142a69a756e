"""Sharded (DCP) checkpoints: resharding across world sizes, DDP <-> FSDP, async, kill -9, bad input.

The multi-process tests run tests/checkpoint/scripts/sharded_job.py under torchrun (gloo): it saves
from 2 ranks (FSDP and DDP, sync and async) and loads at 2 and 3 ranks, comparing every parameter and
optimizer value with the full state the saver had; its load runs at 1 rank in this process (one
plain process, no process group). A launch is the cost here (every rank imports torch): the 2-rank
loads and the kill during an async save run in the saving launch, after the saves: 2 launches in all.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from checkpoint_helpers import Counter, load_in_this_process
from torch import nn

import warm
from shoal.checkpoint.sharded import (
    FORMAT,
    META,
    checkpoint_name,
    is_sharded,
    load_sharded,
    read_meta,
    save_sharded,
    sharded_checkpoints,
)
from shoal.errors import ShoalError
from shoal.workloads.language_model import TinyGPT

SCRIPT = Path(__file__).parent / "scripts" / "sharded_job.py"
S3, S5 = "ckpt-e00001-s000000003.dcp", "ckpt-e00001-s000000005.dcp"


def _torchrun(nproc: int, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    proc = warm.run([*cmd, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _plain(*args: str) -> None:
    load_in_this_process(SCRIPT, *args)


@pytest.fixture(scope="module")
def launch(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One launch of 2 ranks, its directory and what it ended with. First the checkpoints: ``fsdp/``
    and ``ddp/``, each at step 3 (sync) and 5 (async). The same 2 ranks then load them across
    strategies into fresh models (every model rebuilt and the RNG reseeded before each load, as in a
    new process): ``crossed.json``, the results of ddp <- fsdp step 3, fsdp <- ddp step 3 and ddp <-
    fsdp step 5. Last, in ``killed/``, a sync save, then an async one during which rank 0 SIGKILLs
    itself (so the launch fails): its first collective save proves every rank went through the jobs
    before it."""
    out = tmp_path_factory.mktemp("sharded")
    crossed = [f"ddp={out / 'fsdp' / S3}", f"fsdp={out / 'ddp' / S3}", f"ddp={out / 'fsdp' / S5}"]
    (out / "killed").mkdir()
    load = ":".join(["load", str(out / "crossed.json"), *crossed])
    proc = _torchrun(2, f"save:{out}", load, f"kill:{out / 'killed'}", check=False)
    assert (out / "killed" / "killing").is_file(), f"rank 0 ended before it killed itself:\n{proc.stderr[-4000:]}"
    return out, proc


@pytest.fixture(scope="module")
def saved(launch) -> Path:
    """The directory of the checkpoints saved by 2 ranks (see ``launch``)."""
    return launch[0]


def _exact(result: dict, step: int) -> None:
    assert result["values"] == 162 and result["tensors"] == 120  # 30 parameters; step, exp_avg, exp_avg_sq each
    assert result["max_diff"] == 0.0, result["worst"]
    assert result["extra"] == {"epoch": 1, "step": step} and result["position"] == step
    assert result["saved_world"] == 2
    # The data position came back from rank 0's state: the rest of the epoch, re-split over this
    # world size, holds every sample the saver's ranks had not seen, and no seen one but as padding.
    before = [i for rank in result["seen_before"] for i in rank]
    rest = [i for rank in result["rest"] for i in rank]
    assert len(before) == len(set(before)) == 2 * 4 * step
    assert set(before) | set(rest) == set(range(50))
    world = len(result["rest"])
    assert len(rest) == -(-(50 - len(before)) // world) * world  # padded to a multiple of the world size
    assert len(set(rest) & set(before)) <= world - 1  # only padding repeats


@pytest.mark.multiprocess
def test_two_ranks_to_one_plain_process(saved, tmp_path):
    out = tmp_path / "r.json"
    _plain(str(out), f"none={saved / 'fsdp' / S3}", f"none={saved / 'fsdp' / S5}", f"none={saved / 'ddp' / S3}")
    results = json.loads(out.read_text())
    for result, step in zip(results, (3, 5, 3)):
        _exact(result, step)
        # Another world size: the per-rank object keeps its own state.
        assert not result["per_rank_restored"] and result["draws"][0][1] == -1


@pytest.mark.multiprocess
def test_two_ranks_to_three_fsdp_ranks(saved, tmp_path):
    out = tmp_path / "r.json"
    _torchrun(3, f"load:{out}:fsdp={saved / 'fsdp' / S3}:fsdp={saved / 'ddp' / S5}")
    results = json.loads(out.read_text())
    for result, step in zip(results, (3, 5)):
        _exact(result, step)
        assert not result["per_rank_restored"] and [thing for _, thing in result["draws"]] == [-1, -1, -1]


@pytest.mark.multiprocess
def test_ddp_and_fsdp_load_each_others_checkpoints_with_per_rank_state(saved):
    results = json.loads((saved / "crossed.json").read_text())  # loaded by the saving launch
    assert [r["strategy"] for r in results] == ["ddp", "fsdp", "ddp"]
    for result, step in zip(results, (3, 3, 5)):
        _exact(result, step)
        assert result["per_rank_restored"]
        assert [thing for _, thing in result["draws"]] == [100, 101]
    # Same world size: every rank's RNG comes back, so each draws what the saver drew next.
    for result, kind in zip(results[:2], ("fsdp", "ddp")):
        saver = [json.loads((saved / kind / f"draw-{r}.json").read_text()) for r in range(2)]
        assert saver[0] != saver[1]
        assert [draw for draw, _ in result["draws"]] == saver


@pytest.mark.multiprocess
def test_kill_9_during_an_async_save_leaves_the_previous_checkpoint(launch):
    directory, proc = launch[0] / "killed", launch[1]
    assert proc.returncode != 0
    assert (directory / "killing").is_file(), f"rank 0 ended before it killed itself:\n{proc.stderr[-4000:]}"
    seen = (directory / "killing").read_text().split()
    assert any(name.endswith(".distcp") for name in seen)  # killed while shards were being written
    first, second = directory / "ckpt-e00001-s000000001.dcp", directory / "ckpt-e00001-s000000002.dcp"
    stale = directory / f".tmp-{second.name}"
    assert is_sharded(first) and not second.exists() and stale.is_dir()

    # The previous checkpoint loads (one plain process), exactly as saved.
    model = TinyGPT.preset("small")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    found = load_sharded(first, {"model": model, "optimizer": opt})
    assert found.extra == {"step": 1} and found.world_size == 2
    reference = torch.load(f"{first}.reference.pt", weights_only=True)
    for name, value in model.state_dict().items():
        assert torch.equal(value, reference["model"][name]), name
    moments = opt.state_dict()["state"]
    assert len(moments) == len(list(model.parameters()))
    for index, name in enumerate(n for n, _ in model.named_parameters()):
        assert torch.equal(moments[index]["exp_avg"], reference["optim"]["state"][name]["exp_avg"]), name

    # The next save in that directory removes what the killed one left.
    save_sharded(directory / "ckpt-e00001-s000000003.dcp", {"model": model, "optimizer": opt})
    assert not stale.exists() and is_sharded(directory / "ckpt-e00001-s000000003.dcp")


def test_one_process_round_trip_commit_callback_and_replace(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    committed = []
    target = tmp_path / "ckpts" / "ckpt-e00000-s000000001.dcp"
    pending = save_sharded(
        target, {"model": model, "optimizer": opt, "count": Counter(7)}, extra={"step": 1}, on_commit=committed.append
    )
    assert pending.done() and pending.wait() == target and committed == [target]
    assert read_meta(target)["format"] == FORMAT and read_meta(target)["world_size"] == 1
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]  # no temporaries left

    fresh, count = nn.Linear(4, 3), Counter()
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    found = load_sharded(target, {"model": fresh, "optimizer": fresh_opt, "count": count})
    assert found.extra == {"step": 1} and found.per_rank_restored and count.value == 7
    assert torch.equal(fresh.weight, model.weight)
    assert torch.equal(
        fresh_opt.state_dict()["state"][0]["momentum_buffer"], opt.state_dict()["state"][0]["momentum_buffer"]
    )

    # Saving the same name again replaces it (async this time), and nothing else is left behind.
    with torch.no_grad():
        model.weight.add_(1.0)
    save_sharded(target, {"model": model, "optimizer": opt, "count": Counter(8)}, async_=True).wait()
    load_sharded(target, {"model": fresh, "optimizer": fresh_opt, "count": count})
    assert torch.equal(fresh.weight, model.weight) and count.value == 8
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]


def test_bad_checkpoints_and_states_are_one_line_errors(tmp_path):
    with pytest.raises(ShoalError, match="is not a shoal sharded checkpoint") as err:
        load_sharded(tmp_path, {"model": nn.Linear(2, 2)})
    assert "ckpt-*.dcp" in err.value.hint
    (tmp_path / META).write_text(json.dumps({"format": "other", "format_version": 9}))
    with pytest.raises(ShoalError, match="has format 'other' version 9"):
        read_meta(tmp_path)
    (tmp_path / META).write_text(json.dumps({"format": FORMAT, "format_version": 1}))
    with pytest.raises(ShoalError, match=r"is incomplete \(no DCP .metadata\)"):
        read_meta(tmp_path)

    target = tmp_path / "ckpt-e00000-s000000001.dcp"
    save_sharded(target, {"model": nn.Linear(2, 2), "count": Counter(1)})
    with pytest.raises(ShoalError, match="does not fit this model or optimizer") as err:
        load_sharded(target, {"model": nn.Linear(3, 3)})
    assert "\n" not in str(err.value) and err.value.hint
    with pytest.raises(ShoalError, match="has no state for steps"):
        load_sharded(target, {"model": nn.Linear(2, 2), "steps": Counter()})
    with pytest.raises(ShoalError, match="holds 0 optimizer\\(s\\), 1 given"):
        model = nn.Linear(2, 2)
        load_sharded(target, {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=1)})
    with pytest.raises(ShoalError, match="holds one model, got 2"):
        save_sharded(tmp_path / "x.dcp", {"a": nn.Linear(2, 2), "b": nn.Linear(2, 2)})


class Evil:
    def __reduce__(self):
        return (print, ("this would run when unpickled",))


def test_a_checkpoint_cannot_run_code_when_loaded(tmp_path):
    target = tmp_path / "ckpt-e00000-s000000001.dcp"
    save_sharded(target, {"model": nn.Linear(2, 2)}, extra={"payload": Evil()})
    with pytest.raises(ShoalError, match="does not load safely") as err:
        load_sharded(target, {"model": nn.Linear(2, 2)})
    assert err.value.hint


def test_an_optimizer_that_has_not_stepped_stays_fresh(tmp_path):
    # DCP's get_state_dict would step it once with zero gradients to make its state, moving Adam's
    # step counter: a run resumed from a checkpoint taken before the first step would not be exact.
    model = nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    target = tmp_path / checkpoint_name(0, 0)
    save_sharded(target, {"model": model, "optimizer": opt})
    assert opt.state_dict()["state"] == {} and read_meta(target)["stepped_optimizers"] == []
    fresh = nn.Linear(3, 2)
    fresh_opt = torch.optim.Adam(fresh.parameters())
    load_sharded(target, {"model": fresh, "optimizer": fresh_opt})
    assert fresh_opt.state_dict()["state"] == {} and torch.equal(fresh.weight, model.weight)


def test_names_and_listing_follow_the_managers_order(tmp_path):
    assert checkpoint_name(1, 100) == "ckpt-e00001-s000000100.dcp"
    model = nn.Linear(2, 2)
    for epoch, step in ((2, 5), (1, 30), (10, 1)):
        save_sharded(tmp_path / checkpoint_name(epoch, step), {"model": model})
    (tmp_path / ".tmp-ckpt-e00011-s000000001.dcp").mkdir()  # a killed save: not listed
    (tmp_path / "ckpt-e00012-s000000001.dcp").mkdir()  # no metadata: not listed
    names = [p.name for p in sharded_checkpoints(tmp_path)]
    assert names == [checkpoint_name(1, 30), checkpoint_name(2, 5), checkpoint_name(10, 1)]
    assert sharded_checkpoints(tmp_path / "missing") == []


def test_an_unwritable_directory_is_one_line_with_a_hint(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ShoalError, match=r"cannot write the checkpoint .*ckpt-e00000-s000000001.dcp") as err:
        save_sharded(blocker / checkpoint_name(0, 1), {"model": nn.Linear(2, 2)})
    assert "permissions" in err.value.hint
