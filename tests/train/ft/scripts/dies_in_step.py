"""A workload whose replica group ``DIE_GROUP`` SIGKILLs itself inside a step, on its first start:
``shoal train tests/train/ft/scripts/dies_in_step.py:DiesInStep --fault-tolerance``. At its
``DIE_AT``-th forward pass (default 20), once every other group waits in the step's all-reduce
(their progress records say so), it dies as backward begins, before it sends its gradients, so
that every other group is left in the step's all-reduce without it: the fault that stalled the groups across gloo's ring from the dead one until the collective timeout. A tiny MLP on
``SAMPLES`` (default 2400) random points; a step is a few milliseconds."""

from __future__ import annotations

import os
import signal
import time

import torch
from torch import nn

import shoal
from shoal.progress import progress_path, read_one, run_progress_dir


def _others_wait_for_me(run_dir: str) -> None:
    """Until every other group is in backward at this group's step: in the step's gradient
    all-reduce, which waits for the step's quorum (it forms during the forward pass), and so for
    this group's gradients. Dying now, this group dies a member of the step."""
    progress = run_progress_dir(run_dir)
    me, groups = int(os.environ["SHOAL_REPLICA_GROUP"]), int(os.environ["SHOAL_REPLICA_GROUPS"])
    step = read_one(progress_path(progress, me)).step
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        records = [read_one(progress_path(progress, g)) for g in range(groups) if g != me]
        if all(r is not None and r.step == step and r.phase == "backward" for r in records):
            return
        time.sleep(0.005)


class _Net(nn.Module):
    def __init__(self, die_at: int | None, run_dir: str) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
        self.die_at, self.forwards, self.run_dir = die_at, 0, run_dir

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        self.forwards += 1
        if self.forwards == self.die_at and out.requires_grad:
            _others_wait_for_me(self.run_dir)
            out.register_hook(lambda grad: os.kill(os.getpid(), signal.SIGKILL))  # the first thing backward does
        return out


class DiesInStep(shoal.Workload):
    defaults = {"epochs": 1, "batch_size": 8, "lr": 0.1}

    def load(self, cfg, device, rank=0):
        x = torch.randn(int(os.environ.get("SAMPLES", "2400")), 8, generator=torch.Generator().manual_seed(0))
        y = (x.sum(1) > 0).long()
        return shoal.WorkloadData(train=(x, y), test=(x[:64], y[:64]), num_classes=2)

    def build_model(self, cfg, num_classes):
        victim = os.environ.get("SHOAL_REPLICA_GROUP") == os.environ.get("DIE_GROUP", "1")
        first_start = os.environ.get("SHOAL_REPLICA_STARTS", "1") == "1"
        return _Net(int(os.environ.get("DIE_AT", "20")) if victim and first_start else None, cfg.out)
