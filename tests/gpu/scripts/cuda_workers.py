"""The CUDA paths seen from inside the workers; prints one JSON line (a list, one entry per rank).

python cuda_workers.py pinned DEVICE   shoal.run on 2 workers with --device DEVICE: each rank's
                                       device, current CUDA device, backend, socket interface
                                       variables and an all-reduce's sum
python cuda_workers.py shared          shoal.run on 2 spawned CPU-device workers that both put their
                                       tensors on cuda:0 and all-reduce them over gloo (one GPU)
shoal run --nproc 1 cuda_workers.py ifname DEVICE
                                       one rank under shoal's launcher: the variables it set, then a
                                       group of one over nccl (cuda) or gloo (cpu) that must work
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

import shoal

IFNAMES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def pinned() -> dict:
    ctx = shoal.current()
    total = torch.tensor([float(ctx.rank + 1)], device=ctx.device)
    dist.all_reduce(total)
    return {
        "rank": ctx.rank,
        "local_rank": ctx.local_rank,
        "device": str(ctx.device),
        "current_device": torch.cuda.current_device() if ctx.device.type == "cuda" else None,
        "backend": dist.get_backend(),
        "ifnames": {k: os.environ.get(k) for k in IFNAMES},
        "sum": total.item(),
        "sum_device": str(total.device),
    }


def shared() -> dict:
    """gloo moves CUDA tensors (through host memory): what two processes on one GPU can do."""
    rank = dist.get_rank()
    total = torch.full((1024,), float(rank + 1), device="cuda:0")
    dist.all_reduce(total)
    gathered = [torch.empty(2, device="cuda:0") for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, torch.full((2,), float(rank), device="cuda:0"))
    return {
        "rank": rank,
        "backend": dist.get_backend(),
        "sum": total[0].item(),
        "all_equal": bool((total == total[0]).all()),
        "sum_device": str(total.device),
        "gathered": [g.tolist() for g in gathered],
    }


def ifname(device: str) -> dict:
    """Under shoal's launcher: the interface variables it set, and a group of one that uses them."""
    seen = {k: os.environ.get(k) for k in IFNAMES}
    cuda = device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        total = torch.ones(4, device=f"cuda:{os.environ['LOCAL_RANK']}" if cuda else "cpu")
        dist.all_reduce(total)
        return {"ifnames": seen, "backend": dist.get_backend(), "sum": total.sum().item(), "device": str(total.device)}
    finally:
        dist.destroy_process_group()


def main(mode: str, device: str = "cpu") -> None:
    if mode == "shared" or device == "cuda":
        # CUDA initialised here first: a forked worker could not use it again ("Cannot re-initialize
        # CUDA in forked subprocess"), so workers that use CUDA prove they were spawned.
        torch.zeros(1, device="cuda")
    if mode == "pinned":
        result = shoal.run(pinned, nproc=2, device=device, all_ranks=True)
    elif mode == "shared":
        result = shoal.run(shared, nproc=2, device="cpu", backend="gloo", start_method="spawn", all_ranks=True)
    else:
        result = [ifname(device)]
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
