"""A user's script on the library API: shoal.init(), one all_reduce, its view of the job saved.

Usage: shoal_init_allreduce.py OUT_DIR
Writes OUT_DIR/rank{rank}.json; run unchanged under mpirun, srun, PMI launchers and shoal run.
"""

import json
import os
import socket
import sys

import torch
import torch.distributed as dist

import shoal

ctx = shoal.init(device="cpu")
total = torch.tensor([float(ctx.rank + 1)])
dist.all_reduce(total)
env = ctx.environment
with open(os.path.join(sys.argv[1], f"rank{ctx.rank}.json"), "w") as f:
    json.dump(
        {
            "scheme": env.scheme,
            "rank": env.rank,
            "world_size": env.world_size,
            "local_rank": env.local_rank,
            "local_world_size": env.local_world_size,
            "node_rank": env.node_rank,
            "num_nodes": env.num_nodes,
            "main_address": env.main_address,
            "sum": total.item(),
            "pid": os.getpid(),
            "gloo_socket_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
            "host": socket.gethostname(),
        },
        f,
    )
ctx.print(f"all_reduce over {ctx.world_size} ranks ({env.scheme}): {total.item()}")
ctx.shutdown()
