"""Horovod-style scripts that go wrong the ways issue 12 lists; each must fail with one line and a HINT.

Usage: hvd_bad_input.py CASE
       hvd_bad_input.py --each DIR CASE...
  before-init      hvd.rank() before hvd.init()
  model-differs    each rank builds a different model, then wraps its optimizer
  adasum           DistributedOptimizer(op=hvd.Adasum)
  elastic          @hvd.elastic.run
  timeline         hvd.start_timeline(...)
  missing-name     hvd.SyncBatchNorm
  shape-differs    rank 1 passes hvd.allreduce a transposed tensor
  none             nothing goes wrong (reaches the end)

With ``--each``, this process imports torch and shoal.horovod once, then forks one child per CASE
(one after the other) that runs it as the script's own process would: an uncaught error goes to the
interpreter's excepthook and the child exits with status 1; its stdout and stderr go to DIR/CASE.out
and DIR/CASE.err, its exit status to DIR/CASE.status (0.3 CPU-s a case, against 1.8 for a fresh
interpreter). Only the cases that wrap an optimizer build one (the first optimizer imports
torch._dynamo: 1.1 CPU-s).
"""

import gc
import os
import sys

import torch
from torch import nn

import shoal.horovod as hvd


def each(directory: str, cases: list[str]) -> str:
    """In each forked child, its case (the child goes on to run it); the parent exits once all ended."""
    gc.freeze()  # the imported objects: no collection in a child walks them (each walk copies their pages)
    for case in cases:
        pid = os.fork()
        if pid == 0:
            for fd, suffix in ((1, "out"), (2, "err")):
                target = os.open(os.path.join(directory, f"{case}.{suffix}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(target, fd)
                os.close(target)
            return case
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        with open(os.path.join(directory, f"{case}.status"), "w") as f:
            f.write(str(status))
    sys.exit(0)


case = each(sys.argv[2], sys.argv[3:]) if sys.argv[1] == "--each" else sys.argv[1]
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
