"""A Horovod-style PyTorch script on ``shoal.horovod``: the MPI operator tutorial's steps, one import changed.

hvd.init; the learning rate scaled by hvd.size(); the data sharded with DistributedSampler; the
initial state broadcast from rank 0; hvd.DistributedOptimizer; a checkpoint on rank 0 only.

Usage: hvd_digits.py OUT_DIR   (under mpirun; writes OUT_DIR/hvd-rank{r}.json, OUT_DIR/hvd-checkpoint.pt)
"""

import json
import os
import socket
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import shoal.horovod as hvd  # was: import horovod.torch as hvd
from shoal.workloads.digits import load_digits_arrays

out = sys.argv[1]
hvd.init()
torch.manual_seed(hvd.rank())  # different initial weights: the broadcast below must align them

pixels, targets = load_digits_arrays()  # scikit-learn's digits, without its 1 s import
dataset = TensorDataset(torch.tensor(pixels, dtype=torch.float32) / 16.0, torch.tensor(targets))
sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=0)
loader = DataLoader(dataset, batch_size=32, sampler=sampler)

model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * hvd.size(), momentum=0.9)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

for epoch in range(2):
    sampler.set_epoch(epoch)
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()

total = hvd.allreduce(loss.detach(), op=hvd.Average, name="final_loss")
weights = torch.cat([p.detach().flatten() for p in model.parameters()])
if hvd.rank() == 0:
    torch.save(model.state_dict(), os.path.join(out, "hvd-checkpoint.pt"))
with open(os.path.join(out, f"hvd-rank{hvd.rank()}.json"), "w") as f:
    json.dump(
        {
            "rank": hvd.rank(),
            "size": hvd.size(),
            "local_rank": hvd.local_rank(),
            "host": socket.gethostname(),
            "loss": total.item(),
            "weights_sum": round(weights.sum().item(), 5),
        },
        f,
    )
hvd.shutdown()
