"""Rank 1 fails after joining the process group; the other ranks are busy and must be stopped.

Usage: fail_rank1.py PID_DIR MODE
  MODE raise:   rank 1 raises ValueError("boom at rank 1"); the others sleep in a long "step",
                so only the agent can end them.
  MODE sigkill: rank 1 kills itself with SIGKILL; the others wait in an all_reduce and die of
                "Connection closed by peer" a moment later (a consequence, not the root cause).
Every worker first writes PID_DIR/rank{RANK}.pid, so a test can check that none is left running.
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

pid_dir, mode = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
with open(os.path.join(pid_dir, f"rank{rank}.pid"), "w") as f:
    f.write(str(os.getpid()))
dist.init_process_group("gloo")
# Both ranks past the group's set-up before rank 1 fails: else rank 0 can fail on its own, still
# connecting to the peer that just left, and be reported as a rank that "failed too".
dist.barrier()


def check(value: int) -> None:
    if value == 1:
        raise ValueError(f"boom at rank {value}")


if rank == 1:
    if mode == "raise":
        check(rank)
    else:
        os.kill(os.getpid(), signal.SIGKILL)
elif mode == "raise":
    time.sleep(120)
else:
    dist.all_reduce(torch.ones(1))
