"""How long CheckpointManager.save blocks training: sync vs async sharded saves (docs/SHARDING.md).

Run under torchrun: ``python -m torch.distributed.run --standalone --nproc-per-node 2
tests/checkpoint/scripts/manager_blocking.py DIR [STRATEGY] [ROUNDS]``. A TinyGPT of 12.9 M
parameters (52 MB of float32 weights, 155 MB with Adam's two moments) under STRATEGY (``fsdp``, the
default, or ``ddp``) is saved ROUNDS times by each manager (``keep=2``: retention deletes as it
goes), the disk synced before each save; rank 0 prints the median seconds ``save()`` blocked and,
for async, until the checkpoint was committed (``wait()``). With ``ddp`` the ``.pt`` manager
(rank 0 writes one file) is measured too.
"""

import os
import statistics
import time

import torch.distributed as dist
from jobkit import blocking_setup, finish

from shoal.checkpoint.manager import CheckpointManager

out, strategy, rounds, rank, world, model, opt, n_params = blocking_setup(n_layers=4)

managers = {
    "sync .dcp": CheckpointManager(out / "sync", keep=2, sharded=True),
    "async .dcp": CheckpointManager(out / "async", keep=2, async_save=True),
}
if strategy == "ddp":
    managers["sync .pt"] = CheckpointManager(out / "pt", keep=2)
blocked: dict[str, list[float]] = {name: [] for name in managers}
committed: dict[str, list[float]] = {name: [] for name in managers}
for r in range(rounds + 1):  # round 0 warms up (process groups, DCP's executor)
    for name, manager in managers.items():
        os.sync()
        dist.barrier()
        start = time.perf_counter()
        manager.save(epoch=1, step=r, objects={"model": model, "optimizer": opt})
        returned = time.perf_counter() - start
        manager.wait()
        done = time.perf_counter() - start
        if r:
            blocked[name].append(returned)
            committed[name].append(done)
if rank == 0:
    print(
        f"{strategy} at {world} ranks, {n_params / 1e6:.1f} M parameters ({n_params * 4 / 1e6:.0f} MB; "
        f"{n_params * 12 / 1e6:.0f} MB with Adam), median of {rounds}:"
    )
    for name in managers:
        print(
            f"  {name:10}  save() blocked {statistics.median(blocked[name]):.3f} s, "
            f"committed after {statistics.median(committed[name]):.3f} s",
            flush=True,
        )
finish()
