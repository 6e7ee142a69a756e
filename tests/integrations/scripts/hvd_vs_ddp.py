"""The same training run two ways: Horovod-style (shoal.horovod) or plain DDP, for weight comparisons.

Usage (under torchrun, 2 processes): hvd_vs_ddp.py MODE OUT [--passes K] [--fp16] [--sum] [--predivide F]
  [--steps N] [--width W] [--lr LR]
MODE is ``hvd`` or ``ddp``. Same seed, model, data and per-rank batches; DDP accumulates K micro-batches
under ``no_sync()``, shoal.horovod with ``backward_passes_per_step=K``. Rank 0 writes OUT (initial and final
weights, the mean seconds per optimizer step after the first 5).
"""

import argparse
import contextlib
import time

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("mode", choices=["hvd", "ddp"])
parser.add_argument("out")
parser.add_argument("--passes", type=int, default=1)
parser.add_argument("--fp16", action="store_true")
parser.add_argument("--sum", action="store_true")
parser.add_argument("--predivide", type=float, default=1.0)
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--width", type=int, default=64)
parser.add_argument("--lr", type=float, default=0.05)
args = parser.parse_args()

torch.set_num_threads(1)


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(32, args.width), nn.ReLU(), nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, 10)
    )


def batch(rank: int, step: int, micro: int):
    generator = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
    return torch.randn(16, 32, generator=generator), torch.randint(0, 10, (16,), generator=generator)


model = build()
initial = {k: v.clone() for k, v in model.state_dict().items()}
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
if args.mode == "hvd":
    import shoal.horovod as hvd

    hvd.init()
    rank = hvd.rank()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16 if args.fp16 else hvd.Compression.none,
        backward_passes_per_step=args.passes,
        op=hvd.Sum if args.sum else hvd.Average,
        gradient_predivide_factor=args.predivide,
    )
    net = model
else:
    import gc

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    net = DistributedDataParallel(model)

timings = []
for step in range(args.steps):
    started = time.perf_counter()
    for micro in range(args.passes):
        inputs, targets = batch(rank, step, micro)
        last = micro == args.passes - 1
        context = contextlib.nullcontext() if args.mode == "hvd" or last else net.no_sync()
        with context:
            F.cross_entropy(net(inputs), targets).backward()
    optimizer.step()
    optimizer.zero_grad()
    timings.append(time.perf_counter() - started)

if rank == 0:
    torch.save(
        {"state": model.state_dict(), "initial": initial, "step_s": sum(timings[5:]) / len(timings[5:])}, args.out
    )
if args.mode == "ddp":
    dist.destroy_process_group()
    gc.collect()
