"""``shoal train --fault-tolerance`` with spawned replica groups, on the CPU and on CUDA.

The groups are forked on the CPU and spawned with CUDA (it does not survive a fork); ``cpu`` runs
the spawned path on the CPU (``--start-method spawn``) in every CI run, ``cuda`` the same on a GPU
machine (``make test-gpu``): each group's process on its own GPU with NCCL between the groups when
there are two GPUs, or both groups sharing one GPU over gloo (``--backend gloo``: NCCL refuses two
ranks on one device). Group 1 is SIGKILLed after its first commit; group 0 trains on with its one
process, group 1 is spawned again and heals from it (over gloo, through host memory; over NCCL, on
the device), and both end on the same weights.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from ft_events import check_group_one_healed, events, kill_group_one

import procs

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

CUDA = pytest.param("cuda", marks=pytest.mark.gpu)
EPOCHS = {"cpu": 10, "cuda": 30}
"""Enough steps (of 4 samples) that the survivor still trains when the killed group is back: a
spawned process imports torch afresh (about 5 s here, where a CPU step takes 7 ms)."""
BATCH = 4


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _spawned(pid: int) -> bool:
    """Whether ``pid`` is a process that multiprocessing's spawn started (a fresh interpreter)."""
    return b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_spawned_groups_lose_one_step_and_heal(tmp_path, device):
    if device == "cuda":
        pytest.importorskip("torchft", reason="this GPU machine has no torchft (pip install 'shoal[ft]')")
    backend = "nccl" if device == "cuda" and _gpus() >= 2 else "gloo"
    out = tmp_path / "run"
    args = ["train", "digits", "--fault-tolerance", "--nproc", "2", "--device", device, "--backend", backend,
            "--start-method", "spawn", "--epochs", str(EPOCHS[device]), "--batch-size", str(BATCH), "--out", str(out)]  # fmt: skip
    spawned = []

    def seen_spawned(pid: int) -> int:  # read while it lives
        spawned.append(_spawned(pid))
        return pid

    proc = procs.start(*args, env=procs.launcher_free_env())
    victim, killed_at, stdout, stderr = kill_group_one(proc, out, seen_spawned, timeout=300)
    assert proc.returncode == 0, stderr[-3000:] + stdout[-2000:]
    assert spawned == [True], "group 1's process was not spawned"
    assert f"2 replica groups on {device} (torchft over {backend}," in stdout + stderr, stdout[-2000:]
    check_group_one_healed(events(out), victim, stderr, killed_at)


def _visible_devices() -> str | None:
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def test_each_group_process_starts_with_its_share_of_the_gpus(monkeypatch):
    """The launcher's hand-off in real processes: 2 groups of 2, given four GPUs' names, each start
    with theirs as CUDA_VISIBLE_DEVICES (what each group's rank 0 returns), not the launcher's own."""
    from shoal.train.ft.supervisor import run_replica_groups

    gpus = ("GPU-a", "GPU-b", "GPU-c", "GPU-d")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(gpus))
    results = run_replica_groups(_visible_devices, (), groups=2, group_nproc=2, gpus=gpus)
    assert results == {0: "GPU-a,GPU-b", 1: "GPU-c,GPU-d"}
