"""CheckpointManager with sharded (.dcp) checkpoints: FSDP saves and resumes, resharding, DDP <-> FSDP
crossing in both directions, .pt and .dcp in one directory, corrupt newest skipped, async + kill -9.

The multi-process tests run tests/checkpoint/scripts/manager_sharded_job.py under torchrun (gloo),
a few jobs per launch (a launch is the cost here: every rank imports torch), 3 launches in all: the
shared runs at 2 ranks; at 3 ranks, a load of their checkpoint (2 -> 3) and a short run whose
checkpoint the last launch, at 2 ranks, loads (3 -> 2) before the kill during an async save. The
load at 1 rank (2 -> 1) runs in this process (one plain process, no process group). Every training
run draws its batches from the global RNG of each rank, so "bit-identical" covers the model, Adam's
state, every rank's RNG, a per-rank object and the shared data position.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from checkpoint_helpers import Counter, flat, load_in_this_process
from torch import nn

import warm
from shoal.checkpoint.manager import POINTER, CheckpointManager, restore
from shoal.checkpoint.sharded import META, is_sharded
from shoal.errors import ShoalError

SCRIPT = Path(__file__).parent / "scripts" / "manager_sharded_job.py"
D2, D4, D6 = (f"ckpt-e00001-s{s:09d}.dcp" for s in (2, 4, 6))
P4, P6 = (f"ckpt-e00001-s{s:09d}.pt" for s in (4, 6))


def _launch(nproc: int, *jobs: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    proc = warm.run([*cmd, str(SCRIPT), *jobs], capture_output=True, text=True, timeout=300, **kwargs)
    if check:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _load_here(*fields: str) -> None:
    load_in_this_process(SCRIPT, *fields)


def _assert_identical(got: Path, want: Path) -> None:
    """Every model and optimizer value, every rank's next random draw and per-rank counter, and the
    data position of two runs' ends: equal, bit for bit."""
    a, b = (flat(torch.load(path, weights_only=True)) for path in (got, want))
    assert sorted(a) == sorted(b), sorted(set(a) ^ set(b))
    assert sum(isinstance(v, torch.Tensor) for v in a.values()) == 4 * 30  # 30 parameters; step and 2 moments each
    for key, value in b.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(a[key], value), key
        else:
            assert a[key] == value, key


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """In one launch at 2 ranks: uninterrupted 6-step runs, ``fsdp`` (async .dcp saves) and ``ddp``
    (.pt saves), every 2 steps, keep 2; the step-4 checkpoints copied into new directories (rank 0,
    the others waiting); three runs resumed from them: FSDP from FSDP's .dcp (``same``), DDP from
    FSDP's .dcp (``to_ddp``), FSDP (async) from DDP's .pt (``to_fsdp``); and the .pt manager's
    refusal of an FSDP model. Each run builds its model and manager afresh and reseeds every rank's
    RNG, as a new process would."""
    out = tmp_path_factory.mktemp("manager_sharded")
    _launch(
        2,
        f"train:{out / 'fsdp'}:fsdp:async:6",
        f"train:{out / 'ddp'}:ddp:pt:6",
        f"copy:{out / 'fsdp' / D4}:{out / 'same'}",
        f"copy:{out / 'fsdp' / D4}:{out / 'to_ddp'}",
        f"copy:{out / 'ddp' / P4}:{out / 'to_fsdp'}",
        f"train:{out / 'same'}:fsdp:dcp:6:resume",
        f"train:{out / 'to_ddp'}:ddp:pt:6:resume",
        f"train:{out / 'to_fsdp'}:fsdp:async:6:resume",
        f"refuse:{out / 'refused.json'}",
    )
    return out


@pytest.fixture(scope="module")
def at_three(runs) -> Path:
    """One launch at 3 ranks in the directory of ``runs``: ``fsdp``'s step-4 .dcp loaded (2 -> 3,
    ``r3.json``), then ``fsdp3``: 2 steps of FSDP with a .dcp saved at step 2."""
    _launch(
        3,
        f"load:{runs / 'r3.json'}:fsdp:{runs / 'fsdp' / D4}:{runs / 'fsdp'}.full-4.pt",
        f"train:{runs / 'fsdp3'}:fsdp:dcp:2",
    )
    return runs


@pytest.fixture(scope="module")
def back_at_two(at_three) -> subprocess.CompletedProcess:
    """The last launch, at 2 ranks: ``fsdp3``'s .dcp loaded (3 -> 2, ``from3.json``); then, in
    ``killed/``, an async sharded save and a second one during which rank 0 SIGKILLs the whole job
    (torchrun and every rank, in a session of their own). The kill's first collective proves that
    every rank went through the load."""
    proc = _launch(
        2,
        f"load:{at_three / 'from3.json'}:fsdp:{at_three / 'fsdp3' / D2}:{at_three / 'fsdp3'}.full-2.pt",
        f"kill:{at_three / 'killed'}",
        check=False,
        start_new_session=True,
    )
    assert (at_three / "killed.killing").is_file(), f"rank 0 ended before it killed the job:\n{proc.stderr[-4000:]}"
    return proc


@pytest.mark.multiprocess
def test_async_sharded_saves_keep_the_newest_two_and_point_at_the_last(runs):
    for kind, newest in (("fsdp", [D4, D6]), ("ddp", [P4, P6])):
        manager = CheckpointManager(runs / kind, keep=2)
        assert [p.name for p in manager.checkpoints()] == newest
        assert (runs / kind / POINTER).read_text().strip() == newest[-1]
        assert not [p for p in (runs / kind).iterdir() if p.name.startswith(".tmp-")]
    assert sorted(p.name for p in (runs / "fsdp" / D6).iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        META,
    ]
    # DDP and FSDP compute the same bits at 2 ranks (docs/SHARDING.md): the crossings below compare
    # with either.
    _assert_identical(runs / "ddp.final.pt", runs / "fsdp.final.pt")


@pytest.mark.multiprocess
def test_fsdp_resumed_from_its_dcp_at_the_same_world_size_is_bit_identical(runs):
    _assert_identical(runs / "same.final.pt", runs / "fsdp.final.pt")
    assert [p.name for p in CheckpointManager(runs / "same").checkpoints()] == [D4, D6]


@pytest.mark.multiprocess
def test_ddp_resumes_an_fsdp_dcp_and_fsdp_resumes_a_ddp_pt_bit_identically(runs):
    _assert_identical(runs / "to_ddp.final.pt", runs / "fsdp.final.pt")
    _assert_identical(runs / "to_fsdp.final.pt", runs / "ddp.final.pt")
    # Each went on in its own format beside the one it resumed: one (epoch, step) order.
    assert [p.name for p in CheckpointManager(runs / "to_ddp").checkpoints()] == [D4, P6]
    assert [p.name for p in CheckpointManager(runs / "to_fsdp").checkpoints()] == [P4, D6]
    assert (runs / "to_fsdp" / POINTER).read_text().strip() == D6


def _resharded(result: dict, saved_world: int, world: int) -> None:
    assert result["max_diff"] == 0.0, result["worst"]
    assert result["values"] == 162  # 30 parameters; step, exp_avg, exp_avg_sq of each; the param group's values
    assert result["saved_world"] == saved_world
    # The shared data position comes back; on another world size the per-rank objects keep what
    # the new ranks were seeded with, as with .pt checkpoints.
    assert result["position"] == result["step"]
    assert result["counters"] == [-1] * world
    assert result["extra"] == {"epoch": 1, "step": result["step"], "x": result["step"]}


@pytest.mark.multiprocess
def test_resharding_3_to_2(at_three, back_at_two):
    _resharded(json.loads((at_three / "from3.json").read_text()), 3, 2)


@pytest.mark.multiprocess
def test_resharding_2_to_3_and_2_to_1(at_three, tmp_path):
    _resharded(json.loads((at_three / "r3.json").read_text()), 2, 3)
    _load_here(str(tmp_path / "r1.json"), "none", str(at_three / "fsdp" / D4), f"{at_three / 'fsdp'}.full-4.pt")
    _resharded(json.loads((tmp_path / "r1.json").read_text()), 2, 1)


@pytest.mark.multiprocess
def test_a_pt_manager_refuses_an_fsdp_model_on_every_rank(runs):
    messages = json.loads((runs / "refused.json").read_text())
    assert len(messages) == 2 and messages[0] == messages[1]
    assert "sharded=True" in messages[0]


@pytest.mark.multiprocess
def test_kill_9_of_the_whole_job_during_an_async_save_leaves_the_previous(at_three, back_at_two):
    directory, proc = at_three / "killed", back_at_two
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-4000:]
    seen = Path(f"{directory}.killing").read_text().split()
    assert any(name.endswith(".distcp") for name in seen)  # killed while shards were being written
    first = "ckpt-e00001-s000000001.dcp"
    stale = directory / ".tmp-ckpt-e00001-s000000002.dcp"
    assert stale.is_dir() and not (directory / "ckpt-e00001-s000000002.dcp").exists()
    assert (directory / POINTER).read_text().strip() == first

    # The previous checkpoint is what resume finds (one plain process: 2 -> 1), exactly as saved.
    from shoal.workloads.language_model import TinyGPT

    model = TinyGPT.preset("small")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    manager = CheckpointManager(directory, keep=2, sharded=True)
    found = manager.resume({"model": model, "optimizer": opt})
    assert found.path.name == first and found.step == 1 and found.world_size == 2 and not manager.warnings
    reference = torch.load(f"{directory}.full-1.pt", weights_only=True)
    for name, value in model.state_dict().items():
        assert torch.equal(value, reference["model"][name]), name
    # The next save removes what the killed one left.
    manager.save(epoch=1, step=3, objects={"model": model, "optimizer": opt})
    assert not stale.exists() and (directory / POINTER).read_text().strip() == "ckpt-e00001-s000000003.dcp"


# -- one process (no process group): listing, retention, pointer, corrupt checkpoints -------------


def _trained(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return model, opt


def _mixed(directory: Path, keep: int = 10) -> tuple[CheckpointManager, CheckpointManager]:
    """Saves at steps 1 (.pt), 2 (.dcp), 3 (.pt), 4 (.dcp, async) into one directory."""
    pt = CheckpointManager(directory, keep=keep)
    dcp = CheckpointManager(directory, keep=keep, async_save=True)
    assert dcp.sharded
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for step in (1, 2, 3, 4):
            model, opt = _trained(step)
            manager = dcp if step % 2 == 0 else pt
            path = manager.save(epoch=1, step=step, objects={"model": model, "optimizer": opt, "n": Counter(step)})
            assert path is not None and path.name.endswith(".dcp" if step % 2 == 0 else ".pt")
        dcp.wait()
    # DCP's "assuming ... a single process" (from its writer thread, for the async save) is not the user's business.
    assert not [w for w in seen if "torch.distributed is disabled" in str(w.message)], [str(w.message) for w in seen]
    return pt, dcp


def test_pt_and_dcp_share_one_order_pointer_and_retention(tmp_path):
    pt, _ = _mixed(tmp_path, keep=3)
    names = [p.name for p in pt.checkpoints()]
    assert names == ["ckpt-e00001-s000000002.dcp", "ckpt-e00001-s000000003.pt", "ckpt-e00001-s000000004.dcp"]
    assert (tmp_path / POINTER).read_text().strip() == names[-1]
    model, n = nn.Linear(4, 3), Counter()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    found = pt.resume({"model": model, "optimizer": opt, "n": n})
    assert found.sharded and found.step == 4 and found.epoch == 1 and found.extra == {"epoch": 1, "step": 4}
    assert n.value == 4 and torch.equal(model.weight, _trained(4)[0].weight)
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], _trained(4)[1].state_dict()["state"][0]["exp_avg"])
    # Retention deletes a .dcp directory whole, and the .pt files, oldest first.
    model, opt = _trained(5)
    pt.save(epoch=2, step=5, objects={"model": model, "optimizer": opt, "n": Counter(5)})
    assert [p.name for p in pt.checkpoints()] == [*names[1:], "ckpt-e00002-s000000005.pt"]
    assert not (tmp_path / names[0]).exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_a_corrupt_newest_dcp_is_skipped_with_a_warning(tmp_path):
    pt, _ = _mixed(tmp_path)
    newest = tmp_path / "ckpt-e00001-s000000004.dcp"
    shard = newest / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])  # truncated
    manager = CheckpointManager(tmp_path, sharded=True)
    found = manager.load_latest()
    assert found.path.name == "ckpt-e00001-s000000003.pt" and not found.sharded
    assert len(manager.warnings) == 1 and newest.name in manager.warnings[0] and "truncated" in manager.warnings[0]

    # A damaged .metadata, a damaged shoal.json: skipped too, back to the .pt before.
    (newest / ".metadata").write_bytes(b"not a pickle")
    manager = CheckpointManager(tmp_path)
    assert manager.load_latest().path.name == "ckpt-e00001-s000000003.pt"
    assert ".metadata" in manager.warnings[0]
    third = tmp_path / "ckpt-e00001-s000000002.dcp"
    (tmp_path / "ckpt-e00001-s000000003.pt").unlink()
    (third / META).write_text("{")
    manager = CheckpointManager(tmp_path)
    assert manager.load_latest().path.name == "ckpt-e00001-s000000001.pt" and len(manager.warnings) == 2

    # Given by path (--resume PATH), a corrupt one is a one-line error.
    with pytest.raises(ShoalError, match="cannot resume from .*truncated|cannot resume from .*metadata"):
        manager.load(newest)


def test_an_uncommitted_dcp_is_invisible_and_the_next_save_removes_it(tmp_path):
    pt, dcp = _mixed(tmp_path)
    stale = tmp_path / ".tmp-ckpt-e00001-s000000009.dcp"
    shutil.copytree(tmp_path / "ckpt-e00001-s000000004.dcp", stale)
    no_metadata = tmp_path / "ckpt-e00001-s000000008.dcp"  # killed before DCP's metadata: incomplete
    shutil.copytree(tmp_path / "ckpt-e00001-s000000004.dcp", no_metadata)
    (no_metadata / ".metadata").unlink()
    assert [p.name for p in pt.checkpoints()][-1] == "ckpt-e00001-s000000004.dcp"
    assert pt.load_latest().step == 4 and not pt.warnings
    model, opt = _trained(5)
    pt.save(epoch=1, step=5, objects={"model": model, "optimizer": opt})  # a .pt save cleans up too
    assert not stale.exists()


@pytest.mark.parametrize("named", ["ckpt-e00001-s000000002.dcp", "ckpt-e00001-s000000007.dcp"])
def test_the_pointer_may_name_a_dcp_but_only_a_committed_one(tmp_path, named):
    pt, _ = _mixed(tmp_path)
    (tmp_path / POINTER).write_text(named + "\n")
    if named.endswith("2.dcp"):
        assert pt.load_latest().step == 4  # one or more saves behind: the newest valid one
    else:
        with pytest.raises(ShoalError, match="pointer"):
            pt.load_latest()


def test_restore_of_a_dcp_into_other_objects_names_what_is_missing(tmp_path):
    pt, _ = _mixed(tmp_path)
    found = pt.load_latest()
    model = nn.Linear(4, 3)
    with pytest.raises(ShoalError, match="no state for other"):
        restore(found, {"model": model, "other": Counter()})
    assert is_sharded(found.path)
