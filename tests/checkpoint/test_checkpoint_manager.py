"""CheckpointManager: atomic saves that survive SIGKILL anywhere, fallback, retention, safety."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from checkpoint_helpers import Counter
from torch import nn

import warm
from shoal.atomic import TMP_PREFIX
from shoal.checkpoint.cadence import Cadence
from shoal.checkpoint.manager import POINTER, CheckpointManager, restore
from shoal.errors import ShoalError

SAVE_FOREVER = Path(__file__).parent / "scripts" / "save_forever.py"


def _save(manager, step, value=None):
    return manager.save(epoch=1, step=step, objects={"counter": Counter(step if value is None else value)})


def test_killed_at_random_points_always_leaves_old_or_new(tmp_path):
    """SIGKILL a process that saves in a loop, 5 times at random instants after its first save:
    the newest loadable checkpoint is always the last one completely written, the pointer names it
    or the one before, and a later good save cleans up."""
    rng = random.Random(1234)
    directory = tmp_path / "ckpt"
    last_saved = 0
    for _ in range(5):
        proc = warm.popen(
            [sys.executable, str(SAVE_FOREVER), str(directory)], script=True, stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout.readline().strip() == "ready"
        first = proc.stdout.readline().split()  # ["saved", N]: every round kills after a save
        assert first[0] == "saved" and int(first[1]) == last_saved + 1, first
        time.sleep(rng.uniform(0.0, 0.6))
        proc.send_signal(signal.SIGKILL)
        announced = [int(line.split()[1]) for line in proc.stdout.read().splitlines() if line.startswith("saved")]
        proc.wait(timeout=30)
        last_saved = max([int(first[1]), *announced])
        manager = CheckpointManager(directory, keep=2)
        files = manager.checkpoints()
        found = manager.load_latest()
        assert found is not None and not manager.warnings, manager.warnings
        blob = found.payload["state"]["blob"]
        assert torch.all(blob["weights"] == blob["step"])  # complete, not torn
        assert found.path == files[-1]
        # The newest file is the last save announced, or the one killed after its file was durable.
        assert found.step in (last_saved, last_saved + 1), (found.step, last_saved)
        last_saved = found.step
        pointer = (directory / POINTER).read_text().strip()
        assert pointer in (files[-1].name, *(f.name for f in files[-2:-1]))
    # A good save removes temporaries that the kills left behind.
    manager = CheckpointManager(directory, keep=2)
    _save(manager, 10**6)
    assert not list(directory.glob(f"{TMP_PREFIX}*"))
    assert len(manager.checkpoints()) == 2


def test_a_good_save_removes_what_killed_saves_left(tmp_path):
    # A kill while the checkpoint was written leaves .tmp-ckpt-*, one while the pointer was, .tmp-latest.*
    tmp_path.joinpath(f"{TMP_PREFIX}ckpt-e00001-s000000001.pt.abc").write_bytes(b"half")
    tmp_path.joinpath(f"{TMP_PREFIX}{POINTER}.def").write_text("ckpt-e")
    tmp_path.joinpath(f"{TMP_PREFIX}notes.txt").write_text("not ours")  # someone else's file stays
    _save(CheckpointManager(tmp_path, keep=2), 1)
    assert sorted(p.name for p in tmp_path.glob(f"{TMP_PREFIX}*")) == [f"{TMP_PREFIX}notes.txt"]


def test_corrupt_newest_falls_back_with_a_warning(tmp_path):
    manager = CheckpointManager(tmp_path, keep=5)
    for step in (1, 2, 3):
        _save(manager, step)
    newest = manager.checkpoints()[-1]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # truncated
    found = manager.load_latest()
    assert found.step == 2
    assert len(manager.warnings) == 1 and str(newest) in manager.warnings[0]


def test_none_valid_is_a_clear_error(tmp_path):
    manager = CheckpointManager(tmp_path)
    _save(manager, 1)
    manager.checkpoints()[0].write_bytes(b"garbage")
    with pytest.raises(ShoalError, match="none of the 1 checkpoint"):
        manager.load_latest()


def test_nothing_there_is_none(tmp_path):
    assert CheckpointManager(tmp_path / "absent").load_latest() is None


def test_retention_keeps_the_newest(tmp_path):
    manager = CheckpointManager(tmp_path, keep=2)
    for step in range(1, 6):
        _save(manager, step)
    assert [p.name for p in manager.checkpoints()] == ["ckpt-e00001-s000000004.pt", "ckpt-e00001-s000000005.pt"]
    assert (tmp_path / POINTER).read_text().strip() == "ckpt-e00001-s000000005.pt"


def test_a_checkpoint_cannot_run_code(tmp_path):
    """weights_only loading refuses a pickle that would call a function."""

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    manager = CheckpointManager(tmp_path)
    _save(manager, 1)
    evil = tmp_path / "ckpt-e00001-s000000002.pt"
    torch.save({"format_version": 1, "epoch": 1, "step": 2, "state": Evil(), "world_size": 1}, evil)
    found = manager.load_latest()
    assert found.step == 1 and "does not load" in manager.warnings[0]


def test_model_mismatch_names_the_keys(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(epoch=1, step=1, objects={"model": nn.Linear(2, 2)})
    found = manager.load_latest()
    with pytest.raises(ShoalError, match="missing 0.weight, 0.bias; unexpected weight, bias"):
        restore(found, {"model": nn.Sequential(nn.Linear(2, 2))})


def test_round_trip_restores_state_and_rng(tmp_path):
    manager = CheckpointManager(tmp_path)
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    torch.manual_seed(99)
    manager.save(epoch=2, step=7, objects={"model": model, "optimizer": optimizer}, extra={"note": "x"})
    expected_next = torch.rand(3)
    fresh = nn.Linear(3, 1)
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(0)
    found = manager.resume({"model": fresh, "optimizer": fresh_opt})
    assert (found.epoch, found.step, found.extra) == (2, 7, {"note": "x"})
    assert torch.equal(fresh.weight, model.weight)
    assert torch.equal(
        fresh_opt.state_dict()["state"][0]["momentum_buffer"], optimizer.state_dict()["state"][0]["momentum_buffer"]
    )
    assert torch.equal(torch.rand(3), expected_next)  # the RNG continues where it was saved


@pytest.mark.parametrize(
    "text, every, unit",
    [("2", 2, "epoch"), ("3epochs", 3, "epoch"), ("500steps", 500, "step"), ("0", 0, "epoch"), ("off", 0, "epoch")],
)
def test_cadence_parsing(text, every, unit):
    cadence = Cadence.parse(text)
    assert (cadence.every, cadence.unit) == (every, unit)


def test_cadence_rejects_nonsense():
    with pytest.raises(ShoalError, match="not a count of epochs or steps"):
        Cadence.parse("every tuesday")


@pytest.mark.parametrize(
    "named",
    [
        "../outside.pt",
        "/etc/passwd",
        "ckpt-e00001-s000000001.pt/../../outside.pt",
        "notes.txt",
        "ckpt-e00009-s000000009.pt",
    ],
)
def test_a_pointer_naming_anything_but_a_checkpoint_here_is_refused(tmp_path, named):
    """A tampered (or foreign) ``latest`` pointer: one clear error, nothing loaded, nothing changed."""
    directory = tmp_path / "ckpt"
    manager = CheckpointManager(directory, keep=2)
    _save(manager, 1)
    outside = tmp_path / "outside.pt"
    outside.write_bytes((directory / "ckpt-e00001-s000000001.pt").read_bytes())  # would load fine
    (directory / "notes.txt").write_text("not a checkpoint")
    (directory / POINTER).write_text(named + "\n")
    with pytest.raises(ShoalError, match="checkpoint pointer .* which is not a checkpoint file in") as info:
        CheckpointManager(directory, keep=2).load_latest()
    assert "delete" in info.value.hint
    assert (directory / POINTER).read_text() == named + "\n"


def test_a_pointer_one_save_behind_is_fine(tmp_path):
    """Killed between writing a checkpoint and moving the pointer: the newer complete file wins."""
    manager = CheckpointManager(tmp_path, keep=3)
    _save(manager, 1)
    _save(manager, 2)
    (tmp_path / POINTER).write_text("ckpt-e00001-s000000001.pt\n")
    found = CheckpointManager(tmp_path, keep=3).load_latest()
    assert found is not None and found.step == 2
