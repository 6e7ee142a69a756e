"""A user's own training loop as replica groups: shoal.run(fn, nproc=2, fault_tolerance=True); with
the argument ``hsdp``, 2 groups of 2 processes that shard the model with FSDP2 (nproc=4,
nproc_per_group=2).

Prints one JSON line: every group's committed steps and parameter hash, and the largest difference
between the groups' weights and the same steps trained in one process on the whole global batch.
"""

from __future__ import annotations

import hashlib
import json
import sys

import torch
import torch.nn.functional as F
from torch import nn

import shoal

STEPS, BATCH = 20, 64


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 8, generator=g)
    return x, (x.sum(1) > 0).long()


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2)).double()


def rows(step: int) -> torch.Tensor:
    """The global batch of a step: one order for the whole job."""
    return torch.arange(step * BATCH, (step + 1) * BATCH) % 512


def replica_group(sharded: bool) -> dict:
    ctx = shoal.current()
    net = ctx.wrap(model(), strategy="fsdp") if sharded else model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)  # after wrapping: FSDP's parameters are shards
    replicas = ctx.replicas(net, optimizer)
    x, y = data()
    while (step := replicas.start_step()) < STEPS:
        mine = rows(step)[replicas.data_rank :: replicas.data_world]  # this process's share of the step's batch
        optimizer.zero_grad()
        F.cross_entropy(replicas.model(x[mine].double()), y[mine]).backward()
        replicas.commit()
    replicas.close()
    full = [p.full_tensor() if sharded else p for p in net.parameters()]  # collective in the group
    weights = torch.cat([p.detach().flatten() for p in full])
    return {"group": replicas.group, "step": replicas.step, "weights": weights.tolist()}


def one_process() -> torch.Tensor:
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = data()
    for step in range(STEPS):
        optimizer.zero_grad()
        F.cross_entropy(net(x[rows(step)].double()), y[rows(step)]).backward()
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in net.parameters()])


if __name__ == "__main__":
    sharded = sys.argv[1:] == ["hsdp"]
    groups = shoal.run(
        replica_group, sharded, nproc=4 if sharded else 2, nproc_per_group=2 if sharded else 1,
        fault_tolerance=True, all_ranks=True, threads=1,
    )  # fmt: skip
    reference = one_process()
    report = {
        "groups": [g["group"] for g in groups],
        "steps": [g["step"] for g in groups],
        "hashes": [hashlib.sha256(json.dumps(g["weights"]).encode()).hexdigest() for g in groups],
        "max_diff": max(
            float((torch.tensor(g["weights"], dtype=torch.float64) - reference).abs().max()) for g in groups
        ),
    }
    print(json.dumps(report), file=sys.stdout, flush=True)
