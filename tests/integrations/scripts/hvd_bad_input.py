"""Horovod-style scripts that go wrong the ways issue 12 lists; each must fail with one line and a HINT.

Usage: hvd_bad_input.py CASE
  before-init      hvd.rank() before hvd.init()
  model-differs    each rank builds a different model, then wraps its optimizer
  adasum           DistributedOptimizer(op=hvd.Adasum)
  elastic          @hvd.elastic.run
  timeline         hvd.start_timeline(...)
  missing-name     hvd.SyncBatchNorm
  shape-differs    rank 1 passes hvd.allreduce a transposed tensor
  none             nothing goes wrong (reaches the end)
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
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
if case == "model-differs":
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
elif case == "adasum":
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
