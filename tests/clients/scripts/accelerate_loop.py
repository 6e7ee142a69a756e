"""An Accelerate training loop as a user writes it: ``Accelerator()``, ``prepare``, a few steps with
``accelerator.backward``. Nothing in it knows about shoal.

Usage: torchrun --nproc-per-node 2 accelerate_loop.py RESULTS.jsonl
Each rank appends one JSON line to RESULTS.jsonl: its rank, the world size it saw, and that it finished.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def report(path, **fields):
    with open(path, "a") as f:  # one write per rank: lines from several ranks never interleave
        f.write(json.dumps(fields) + "\n")


def main():
    results = sys.argv[1]
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    x = torch.randn(32, 8)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    steps = 0
    model.train()
    for xb, yb in data:
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
        if steps == 3:
            break
    accelerator.wait_for_everyone()
    checksum = sum(p.detach().double().sum().item() for p in accelerator.unwrap_model(model).parameters())
    report(
        results,
        library="accelerate",
        rank=dist.get_rank() if dist.is_initialized() else 0,
        world_size=dist.get_world_size() if dist.is_initialized() else 1,
        library_world_size=accelerator.num_processes,
        library_rank=accelerator.process_index,
        steps=steps,
        checksum=checksum,
        finished=True,
        pid=os.getpid(),
    )
    accelerator.end_training()


if __name__ == "__main__":
    main()
