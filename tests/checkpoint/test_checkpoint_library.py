"""The library API resumes mid-epoch under another world size: every sample exactly once."""

from __future__ import annotations

import signal
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from conftest import run_shoal
from procs import checkpoints, start_cmd, wait_for

pytestmark = pytest.mark.multiprocess

SCRIPT = Path(__file__).parent / "scripts" / "trace_train.py"
EPOCHS = 20
"""97 samples, batch 4: 260 steps on 2 ranks, 500 on 1 (was 40 epochs, twice that). The first life is
signalled once its second checkpoint is there (step 10) and stopped, measured, at step 15 to 44: 216
or more steps are left, over 6x the most steps (34) it trained while the test found and signalled a
worker. The second life trains the rest of the epochs, which is all more epochs would add."""


def _steps(out: Path) -> dict[int, tuple[int, list[int]]]:
    """step -> (epoch, indices over all ranks), keeping for each step only its last life."""
    by_step: dict[int, dict[str, list[tuple[int, list[int]]]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(out.glob("trace-*.txt")):
        for line in path.read_text().splitlines():
            life, step, epoch, *indices = line.split()
            by_step[int(step)][life].append((int(epoch), [int(i) for i in indices]))
    result = {}
    for step, lives in by_step.items():
        last = lives[max(lives)]  # lives are numbered in order
        result[step] = (last[0][0], [i for _, idx in last for i in idx])
    return result


@pytest.mark.parametrize("first, second", [(2, 1), (1, 3)])
def test_resume_with_another_world_size_sees_every_sample_once(tmp_path, first, second):
    proc = start_cmd(
        sys.executable, "-m", "shoal", "run", "--nproc", str(first), str(SCRIPT), str(tmp_path), "1", str(EPOCHS)
    )
    wait_for(lambda: len(checkpoints(tmp_path / "ckpt")) >= 2 or proc.poll() is not None)
    assert proc.poll() is None, "finished before it could be preempted"
    # Preempt one rank only: the ranks agree, checkpoint the same step, and stop.
    victims = [pid for pid in _descendants(proc.pid) if _is_script(pid)]
    assert len(victims) == first
    import os

    os.kill(victims[-1], signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0
    again = run_shoal("run", "--nproc", str(second), str(SCRIPT), str(tmp_path), "2", str(EPOCHS), timeout=300)
    assert again.returncode == 0, again.stderr
    steps = _steps(tmp_path)
    assert sorted(steps) == list(range(1, max(steps) + 1))
    per_epoch: dict[int, list[int]] = defaultdict(list)
    for epoch, indices in steps.values():
        per_epoch[epoch].extend(indices)
    assert sorted(per_epoch) == list(range(EPOCHS))
    for epoch, indices in per_epoch.items():
        assert set(indices) == set(range(97)), epoch
        assert len(indices) - 97 < max(first, second), epoch  # only the padding of the last step repeats
    # The interruption really happened mid-epoch and both lives contributed.
    lives = {line.split()[0] for p in tmp_path.glob("trace-*.txt") for line in p.read_text().splitlines()}
    assert lives == {"1", "2"}


def _descendants(pid: int) -> list[int]:
    from procs import children

    out, todo = [], [pid]
    while todo:
        for child in children(todo.pop()):
            out.append(child)
            todo.append(child)
    return out


def _is_script(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    # the stderr tee forked by the worker shim keeps the shim's command line: not a worker
    return any(part.endswith(b"trace_train.py") for part in cmdline) and not any(
        part.endswith(b"worker_shim.py") for part in cmdline
    )
