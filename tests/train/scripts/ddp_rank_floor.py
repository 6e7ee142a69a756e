"""What one DDP rank costs to start, in CPU-s (docs/contributing/TEST_TIME.md, "Latest runs"): ``import torch``,
joining the group, DDP's constructor (it imports ``torch._dynamo``: torch/nn/parallel/distributed.py,
``get_optimize_ddp_mode``) and 3 optimizer steps, each from ``resource.getrusage`` of the rank itself.

    .venv/bin/python -m shoal run --nproc 2 tests/train/scripts/ddp_rank_floor.py
"""

import resource
import time


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


marks = [("start", cpu_s())]
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

marks.append(("import torch", cpu_s()))
dist.init_process_group("gloo")
marks.append(("init", cpu_s()))
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
marks.append(("DDP", cpu_s()))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    optimizer.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
marks.append(("3 steps", cpu_s()))
rank = dist.get_rank()
dist.destroy_process_group()
marks.append(("destroy", cpu_s()))
steps = ", ".join(f"{name} {now - before:.2f}" for (_, before), (name, now) in zip(marks, marks[1:]))
time.sleep(0.1 * rank)  # rank 0's line first
print(f"rank {rank}: {steps}; total {marks[-1][1]:.2f} CPU-s", flush=True)
