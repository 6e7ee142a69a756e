"""One replica group as a ``shoal run`` script (docs/FAULT_TOLERANCE.md's recipe): trains STEPS
steps through ``ctx.replicas`` and prints its committed steps and a hash of its weights."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import shoal

STEPS = 10


def main() -> None:
    ctx = shoal.init(threads=1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    _both_started()
    replicas = ctx.replicas(model, optimizer)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 8, generator=g)
    y = (x.sum(1) > 0).long()
    while (step := replicas.start_step()) < STEPS:
        mine = (torch.arange(step * 64, (step + 1) * 64) % 512)[replicas.group :: replicas.groups]
        optimizer.zero_grad()
        F.cross_entropy(replicas.model(x[mine]), y[mine]).backward()
        replicas.commit()
    replicas.close()
    weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    print(json.dumps({"group": replicas.group, "step": replicas.step, "hash": hashlib.sha256(weights).hexdigest()}))
    sys.stdout.flush()


def _both_started() -> None:
    """With READY_DIR set (the test's hand start), wait until every group's process has started:
    hand-started groups have no launcher to gather them, and one that imported torch more than the
    quorum timeout (30 s) after the other, on a loaded machine, left the first without a quorum."""
    ready = os.environ.get("READY_DIR")
    if not ready:
        return
    Path(ready, os.environ["SHOAL_REPLICA_GROUP"]).touch()
    deadline = time.monotonic() + 240
    while len(os.listdir(ready)) < int(os.environ["SHOAL_REPLICA_GROUPS"]) and time.monotonic() < deadline:
        time.sleep(0.05)


if __name__ == "__main__":
    main()
