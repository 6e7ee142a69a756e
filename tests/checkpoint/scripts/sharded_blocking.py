"""How long a training step is blocked by a sharded save: sync vs async (docs/SHARDING.md's figure).

Run under torchrun: ``python -m torch.distributed.run --standalone --nproc-per-node 2
tests/checkpoint/scripts/sharded_blocking.py DIR [STRATEGY] [ROUNDS]``. A TinyGPT of 19 M parameters
(76 MB of float32 weights, 228 MB with Adam's two moments) is saved ROUNDS times each way into DIR
(sync and async alternating, the disk synced before each); rank 0 prints the median seconds the
caller was blocked and, for async, the seconds until the checkpoint was committed.
"""

import os
import statistics
import time

import torch.distributed as dist
from jobkit import blocking_setup, finish

from shoal.checkpoint.sharded import save_sharded

out, strategy, rounds, rank, world, model, opt, n_params = blocking_setup(n_layers=6)

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
finish()
