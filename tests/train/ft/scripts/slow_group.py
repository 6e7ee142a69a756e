"""A workload with one slow replica group: ``shoal train tests/train/ft/scripts/slow_group.py:SlowGroup
--fault-tolerance``. Group ``SLOW_GROUP`` sleeps ``SLOW_S`` seconds (default 0.02) in every forward,
as a slower machine would take longer to compute; the others compute at their own pace. Without
``--fault-tolerance``, rank ``SLOW_RANK`` does. A tiny MLP on ``SAMPLES`` (default 2400) random
points, so that a step is otherwise a few milliseconds."""

from __future__ import annotations

import os
import time

import torch
from torch import nn

import shoal


class _Net(nn.Module):
    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
        self.delay_s = delay_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.net(x)


class SlowGroup(shoal.Workload):
    defaults = {"epochs": 1, "batch_size": 8, "lr": 0.1}

    def load(self, cfg, device, rank=0):
        x = torch.randn(int(os.environ.get("SAMPLES", "2400")), 8, generator=torch.Generator().manual_seed(0))
        y = (x.sum(1) > 0).long()
        return shoal.WorkloadData(train=(x, y), test=(x[:64], y[:64]), num_classes=2)

    def build_model(self, cfg, num_classes):
        mine, chosen = ("SHOAL_REPLICA_GROUP", "SLOW_GROUP") if cfg.fault_tolerance else ("RANK", "SLOW_RANK")
        slow = os.environ.get(mine, "") == os.environ.get(chosen)
        return _Net(float(os.environ.get("SLOW_S", "0.02")) if slow else 0.0)
