"""Horovod-style scripts that go wrong the ways issue 12 lists; each must fail with one line and a HINT.

Usage: hvd_bad_input.py CASE
Only the cases that wrap an optimizer build one (the first optimizer imports torch._dynamo: 1.1 CPU-s).
"""

import sys

import torch
from torch import nn

import shoal.horovod as hvd

case = sys.argv[1]
if case == "before-init":
    print(f"rank {hvd.rank()}")
hvd.init()
width = 8 + hvd.rank() if case == "model-differs" else 8
model = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2))
if case == "model-differs":
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
elif case == "adasum":
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), op=hvd.Adasum)
elif case == "elastic":

    @hvd.elastic.run
    def train(state):
        pass

elif case == "timeline":
    hvd.start_timeline("/tmp/timeline.json")
elif case == "shape-differs":
    hvd.allreduce(torch.zeros(4, 3) if hvd.rank() == 0 else torch.zeros(3, 4), name="grad.w")
elif case == "missing-name":
    model = hvd.SyncBatchNorm.convert_sync_batchnorm(model)
print("not reached", flush=True)
