"""One epoch convention for the library: ``for epoch in range(epochs)`` counts from 0, and
``every="2epochs"`` saves after the 2nd, 4th, 6th... completed epoch (epochs 1, 3, 5), plus the last
one when the caller says it is the last (``final=``); ``shoal train`` counts from 1 and saves after
its epochs 2, 4, 6 as before."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import run_shoal
from shoal.checkpoint.manager import CheckpointManager

SCRIPT = Path(__file__).parent / "scripts" / "epoch_loop.py"
SAVED = re.compile(r"^ckpt-e(\d+)-s\d+\.pt$")


def _epochs_saved(out: Path) -> list[int]:
    return sorted(int(SAVED.match(p.name).group(1)) for p in (out / "ckpt").glob("ckpt-*.pt"))


@pytest.mark.multiprocess
def test_a_two_process_loop_saves_every_second_epoch_and_the_last_across_a_resume(tmp_path):
    first = run_shoal("run", "--nproc", "2", str(SCRIPT), str(tmp_path), "5", timeout=240)
    assert first.returncode == 0, first.stderr
    # Epochs 0-4: the 2nd and 4th completed (1, 3), and 4 because the loop said it was the last.
    assert _epochs_saved(tmp_path) == [1, 3, 4]
    again = run_shoal("run", "--nproc", "2", str(SCRIPT), str(tmp_path), "8", timeout=240)
    assert again.returncode == 0, again.stderr
    # Resumed after epoch 4 over epochs 5-7: the 6th and 8th completed (5, 7); 7 is also the last.
    assert _epochs_saved(tmp_path) == [1, 3, 4, 5, 7]
    lines = (tmp_path / "epochs.txt").read_text().split("\n")[:-1]
    assert [line.split()[0] for line in lines] == [str(e) for e in range(8)], "each epoch trained once"
    assert [line.split()[1] != "-" for line in lines] == [e in (1, 3, 4, 5, 7) for e in range(8)]


@pytest.mark.parametrize(
    "first_epoch, every, epochs, expected",
    [
        (0, "2epochs", range(0, 8), [1, 3, 5, 7]),  # ctx.checkpointer: for epoch in range(8)
        (1, "2epochs", range(1, 9), [2, 4, 6, 8]),  # shoal train: epochs 1..8, as before
        (0, "3", range(5, 8), [5]),  # a resumed loop: the 6th completed epoch
        (1, "1epochs", range(1, 4), [1, 2, 3]),
        (0, "off", range(0, 4), []),
        (0, "5steps", range(0, 4), []),  # a step cadence never saves at an epoch's end
    ],
)
def test_epoch_cadence_counts_completed_epochs_whatever_the_numbering(first_epoch, every, epochs, expected, tmp_path):
    manager = CheckpointManager(tmp_path, every=every, first_epoch=first_epoch)
    due = [e for e in epochs if manager.due(epoch=e, step=10 * e, epoch_end=True)]
    assert due == expected
    last = epochs[-1]
    assert manager.due(epoch=last, step=10 * last, epoch_end=True, final=True) == (every != "off")


def test_trainer_calls_keep_their_cadence(tmp_path):
    # shoal train builds CheckpointManager(directory, every=..., keep=...) and calls due() with its
    # 1-based epochs, final= and force=: the defaults keep that meaning.
    manager = CheckpointManager(tmp_path, every="2", keep=2)
    assert [e for e in range(1, 6) if manager.due(epoch=e, step=e, epoch_end=True, final=e == 5)] == [2, 4, 5]
    assert manager.due(epoch=3, step=7, epoch_end=False, force=True)
    steps = CheckpointManager(tmp_path, every="7steps")
    assert [s for s in range(1, 22) if steps.due(epoch=1, step=s, epoch_end=False)] == [7, 14, 21]


def test_first_epoch_other_than_0_or_1_is_refused(tmp_path):
    from shoal.errors import ShoalError

    with pytest.raises(ShoalError, match="first_epoch must be 0 or 1") as err:
        CheckpointManager(tmp_path, every="2epochs", first_epoch=5)
    assert "range(epochs)" in err.value.hint
