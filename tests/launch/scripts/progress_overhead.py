"""The watchdog's cost in place: a digits-size DDP step (64-128-10 MLP, batch 32, gloo) with the
progress writer's calls (4 phases + step_done) against the same step with a disabled writer,
alternating blocks of 200 steps on every rank at once.

Usage: torchrun --nproc-per-node 2 tests/launch/scripts/progress_overhead.py
"""

import statistics
import tempfile
import time

import torch
import torch.distributed as dist

from shoal.progress import ProgressWriter

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
on = ProgressWriter(tempfile.mkdtemp(), rank)
off = ProgressWriter(None)


def block(w, n=200):
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(n):
        s = time.perf_counter()
        w.phase("data", i)
        w.phase("forward")
        loss = torch.nn.functional.cross_entropy(model(x), y)
        w.phase("backward")
        opt.zero_grad()
        loss.backward()
        w.phase("optimizer")
        opt.step()
        w.step_done(32, time.perf_counter() - s, 0.0)
    return (time.perf_counter() - t0) / n


block(off, 300)
r_on, r_off = [], []
for _ in range(40):
    r_off.append(block(off))
    r_on.append(block(on))
if rank == 0:
    print(
        f"DDP 2 ranks gloo: step off {statistics.median(r_off) * 1e6:.0f} us, on {statistics.median(r_on) * 1e6:.0f} us, median ratio {statistics.median(r_on) / statistics.median(r_off):.4f}, min ratio {min(r_on) / min(r_off):.4f}"
    )
dist.destroy_process_group()
