"""A plain torchrun-style worker: env-var rendezvous, gloo all_reduce, result written to OUT_DIR.

Usage: allreduce.py OUT_DIR
Writes OUT_DIR/rank{RANK}.json with what the worker saw (its env and the all_reduce result).
"""

import json
import os
import sys

import torch
import torch.distributed as dist

out_dir = sys.argv[1]
rank = int(os.environ["RANK"])
world_size = int(os.environ["WORLD_SIZE"])
if rank == 0:  # a progress bar: must reach the console as is (no prefix, carriage returns kept)
    sys.stderr.write("step 1/2\rstep 2/2\r\n")
    sys.stderr.flush()
dist.init_process_group("gloo")
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
dist.destroy_process_group()
seen = {
    "rank": rank,
    "local_rank": int(os.environ["LOCAL_RANK"]),
    "world_size": world_size,
    "master_addr": os.environ["MASTER_ADDR"],
    "master_port": os.environ["MASTER_PORT"],
    "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    "torch_threads": torch.get_num_threads(),
    "sum": t.item(),
    "pid": os.getpid(),
}
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(seen, f)
