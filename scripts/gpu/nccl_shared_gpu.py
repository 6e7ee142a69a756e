"""Does this NCCL accept two ranks on one GPU? A probe for a one-GPU machine, under torchrun.

    torchrun --standalone --nproc-per-node 2 scripts/gpu/nccl_shared_gpu.py --json OUT.json

Both ranks use ``cuda:0`` and all-reduce one tensor over NCCL. NCCL has refused that so far
("Duplicate GPU detected", ncclInvalidUsage, from its init.cc; e.g. NVIDIA/nccl#1241), which is why
the GPU check measures NCCL on one GPU with a world of one. Rank 0 writes what happened; every rank
then exits 0 at once (a communicator left broken by the refusal may hang its own teardown).
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", timeout=timedelta(seconds=30))
    try:
        total = torch.ones(1, device="cuda:0")
        dist.all_reduce(total)
        torch.cuda.synchronize()
        result = {"allowed": True, "sum": total.item()}
    except Exception as error:  # what NCCL says is the result
        result = {"allowed": False, "error": " ".join(str(error).split())[:300]}
    if os.environ.get("RANK") == "0":  # not dist.get_rank(): the group may be broken
        with open(args.json, "w") as f:
            json.dump(result, f)
    os._exit(0)


if __name__ == "__main__":
    main()
