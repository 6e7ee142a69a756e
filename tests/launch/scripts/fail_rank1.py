"""Rank 1 fails; the other ranks are busy and must be stopped.

Usage: fail_rank1.py PID_DIR MODE
  MODE raise:   rank 1 raises ValueError("boom at rank 1") once every rank has written its pid
                file; the others sleep in a long "step", so only the agent can end them. No
                process group (nor torch): what is proven is the launcher's (the failing rank's
                traceback found, the others stopped).
  MODE sigkill: rank 1 kills itself with SIGKILL once every rank has joined the process group; the
                others wait in an all_reduce and die of "Connection closed by peer" a moment later
                (a consequence, not the root cause).
Every worker first writes PID_DIR/rank{RANK}.pid (aside, then renamed: a pid file that exists is
complete), so a test can check that none is left running.
"""

import os
import signal
import sys
import time

pid_dir, mode = sys.argv[1], sys.argv[2]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
path = os.path.join(pid_dir, f"rank{rank}.pid")
with open(path + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(path + ".tmp", path)


def check(value: int) -> None:
    if value == 1:
        raise ValueError(f"boom at rank {value}")


if mode == "raise":
    if rank == 1:
        # Every rank started before this one fails (the agent stops the others at once).
        while len([name for name in os.listdir(pid_dir) if name.endswith(".pid")]) < world:
            time.sleep(0.01)
        check(rank)
    time.sleep(120)
else:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    # Both ranks past the group's set-up before rank 1 dies: else rank 0 can fail on its own, still
    # connecting to the peer that just left, and be reported as a rank that "failed too".
    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(1))
