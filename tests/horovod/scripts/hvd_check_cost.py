"""What the cross-rank check costs per collective: hvd.allreduce_ against torch.distributed.all_reduce.

Usage: shoal run --nproc 2 tests/horovod/scripts/hvd_check_cost.py [ROUNDS]

Each round times, back to back on the same tensor, ``dist.all_reduce`` (no check), the check alone
(``agreement.agree``) and ``hvd.allreduce_`` (check + all_reduce), for a 16-byte and a 4 MiB
float32 tensor, and a grouped_allreduce of 16 small tensors against 16 all_reduces. Rank 0 prints
the median microseconds per call of each.
"""

import statistics
import sys
import time

import torch
import torch.distributed as dist

import shoal.horovod as hvd
from shoal.horovod import agreement

hvd.init()
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 300
settings = {"op": hvd.Sum, "prescale_factor": 1.0, "postscale_factor": 1.0}


def timed(call) -> float:
    start = time.perf_counter()
    call()
    return (time.perf_counter() - start) * 1e6


rows = []
for label, numel in (("16 B", 4), ("4 MiB", 1 << 20)):
    tensor = torch.ones(numel)
    samples = {"all_reduce": [], "check": [], "hvd.allreduce_": []}
    for _ in range(rounds):
        samples["all_reduce"].append(timed(lambda t=tensor: dist.all_reduce(t)))
        samples["check"].append(timed(lambda t=tensor: agreement.agree("allreduce", [t], None, settings)))
        samples["hvd.allreduce_"].append(timed(lambda t=tensor: hvd.allreduce_(t, op=hvd.Sum)))
    rows.append((label, {k: statistics.median(v) for k, v in samples.items()}))

small = [torch.ones(4) for _ in range(16)]
grouped = {"16 x all_reduce": [], "grouped_allreduce_": []}
for _ in range(rounds):
    grouped["16 x all_reduce"].append(timed(lambda: [dist.all_reduce(t) for t in small]))
    grouped["grouped_allreduce_"].append(timed(lambda: hvd.grouped_allreduce_(small, op=hvd.Sum)))

if hvd.rank() == 0:
    print(f"median microseconds per call, {hvd.size()} ranks, {rounds} rounds")
    for label, medians in rows:
        ratio = medians["hvd.allreduce_"] / medians["all_reduce"]
        cells = ", ".join(f"{k} {v:.0f}" for k, v in medians.items())
        print(f"{label}: {cells} (hvd / raw {ratio:.2f})")
    medians = {k: statistics.median(v) for k, v in grouped.items()}
    print("16 tensors of 16 B: " + ", ".join(f"{k} {v:.0f}" for k, v in medians.items()))
hvd.shutdown()
