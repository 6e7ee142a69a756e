"""A torchrun-style gloo worker that reports its progress through shoal.progress, step after step.

Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun's), SHOAL_PROGRESS_DIR, and
HANG_RANK / HANG_STEP: that rank blocks forever in load_batch() at that step (its peers then wait in
all_reduce); SLOW_RANK: that rank computes SLOW_S seconds a step (default 0.03) where the others compute 0.01; STEPS: stop after that many steps;
TERM_HANDLER=1: a Python SIGTERM handler (as shoal.preemption installs), which a rank blocked in a
collective never runs.
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from shoal.progress import ProgressWriter


def load_batch(rank, step):
    if rank == int(os.environ.get("HANG_RANK", -1)) and step == int(os.environ.get("HANG_STEP", 5)):
        time.sleep(3600)  # the hang: a data loader that never returns
    return torch.ones(256)


if os.environ.get("TERM_HANDLER") == "1":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
progress = ProgressWriter.from_env()
dist.init_process_group("gloo")
rank = dist.get_rank()
compute_s = float(os.environ.get("SLOW_S", 0.03)) if rank == int(os.environ.get("SLOW_RANK", -1)) else 0.01
for step in range(int(os.environ.get("STEPS", 10**9))):
    start = time.perf_counter()
    progress.phase("data", step)
    batch = load_batch(rank, step)
    progress.phase("forward")
    time.sleep(compute_s)
    computed = time.perf_counter()
    progress.collective()
    dist.all_reduce(batch)
    progress.phase("optimizer")
    progress.step_done(32, computed - start, time.perf_counter() - computed)
progress.close()
dist.destroy_process_group()
