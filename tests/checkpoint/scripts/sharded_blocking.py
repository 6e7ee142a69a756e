"""How long a training step is blocked by a sharded save: sync vs async (docs/SHARDING.md's figure).

Run under torchrun: ``python -m torch.distributed.run --standalone --nproc-per-node 2
tests/checkpoint/scripts/sharded_blocking.py DIR [STRATEGY] [ROUNDS]``. A TinyGPT of 19 M parameters
(76 MB of float32 weights, 228 MB with Adam's two moments) is saved ROUNDS times each way into DIR
(sync and async alternating, the disk synced before each); rank 0 prints the median seconds the
caller was blocked and, for async, the seconds until the checkpoint was committed.
"""

import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from shoal.checkpoint.sharded import save_sharded
from shoal.distributed.fsdp import apply_fsdp
from shoal.distributed.wrap import apply_ddp
from shoal.workloads.language_model import TinyGPT, lm_loss

out = Path(sys.argv[1])
strategy = sys.argv[2] if len(sys.argv) > 2 else "fsdp"
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = TinyGPT(d_model=512, n_layers=6, n_heads=8, seq_len=64)
n_params = sum(p.numel() for p in model.parameters())
cpu = torch.device("cpu")
model = apply_fsdp(model, device=cpu) if strategy == "fsdp" else apply_ddp(model, cpu, world)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randint(0, 256, (2, 65))
lm_loss(model(x[:, :-1]), x[:, 1:]).backward()
opt.step()

blocked = {"sync": [], "async": []}
committed = []
for r in range(rounds + 1):  # round 0 warms up (process groups, DCP's executor)
    for mode in ("sync", "async"):
        os.sync()
        dist.barrier()
        start = time.perf_counter()
        pending = save_sharded(
            out / f"ckpt-e00000-s{r:09d}-{mode}.dcp", {"model": model, "optimizer": opt}, async_=mode == "async"
        )
        returned = time.perf_counter() - start
        pending.wait()
        done = time.perf_counter() - start
        if r:
            blocked[mode].append(returned)
            if mode == "async":
                committed.append(done)
if rank == 0:
    state_mb = n_params * 12 / 1e6
    print(
        f"{strategy} at {world} ranks, {n_params / 1e6:.1f} M parameters ({n_params * 4 / 1e6:.0f} MB; {state_mb:.0f} MB "
        f"with Adam), median of {rounds}: sync save blocked {statistics.median(blocked['sync']):.3f} s, async "
        f"{statistics.median(blocked['async']):.3f} s (committed after {statistics.median(committed):.3f} s)",
        flush=True,
    )
dist.barrier()
dist.destroy_process_group()
