"""A plain torchrun-style worker: gloo all-reduces in a loop, one result file per rank at the end.

Usage: steps.py OUT_DIR [--steps N] [--die-rank R] [--raise-rank R]
  --die-rank R: on the first attempt (TORCHELASTIC_RESTART_COUNT=0) rank R SIGKILLs itself at
  step 2, as a worker lost to the OOM killer or a hardware fault would die.
  --raise-rank R: rank R raises ValueError at step 2 (every attempt) while the others spend two
  minutes in a "long computation" at that step, out of any collective: only the launchers can
  end them.
Writes OUT_DIR/rank{RANK}.json: rank, world size, attempt, the all-reduce sum, MASTER_ADDR and
GLOO_SOCKET_IFNAME as the worker saw them.
"""

import argparse
import json
import os
import signal
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("out_dir")
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--die-rank", type=int, default=-1)
parser.add_argument("--raise-rank", type=int, default=-1)
args = parser.parse_args()

rank = int(os.environ["RANK"])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
dist.init_process_group("gloo")
world = dist.get_world_size()
total = 0.0
for step in range(args.steps):
    if step == 2 and attempt == 0 and rank == args.die_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    if step == 2 and args.raise_rank >= 0:
        if rank == args.raise_rank:
            raise ValueError(f"boom at rank {rank}")
        time.sleep(120)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    total += t.item()
    time.sleep(0.2)
dist.destroy_process_group()
with open(os.path.join(args.out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(
        {
            "rank": rank,
            "world_size": world,
            "attempt": attempt,
            "sum": total,
            "master_addr": os.environ["MASTER_ADDR"],
            "ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
            "local_rank": int(os.environ["LOCAL_RANK"]),
            "group_rank": int(os.environ["GROUP_RANK"]),
        },
        f,
    )
