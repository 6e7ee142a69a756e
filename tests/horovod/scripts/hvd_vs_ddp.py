"""The same training run two ways: Horovod-style (shoal.horovod) or plain DDP, for weight comparisons.

Usage (under torchrun, 2 processes): hvd_vs_ddp.py OUT RUN [RUN ...] [--steps N] [--width W]
Each RUN is ``MODE`` and options, comma-separated: ``hvd``, ``ddp,passes=2``, ``hvd,fp16``,
``hvd,sum``, ``hvd,predivide=4``, ``ddp,lr=0.1``. MODE is ``hvd`` or ``ddp``. Every run starts
from the same seed, model, data and per-rank batches, one after the other in one job (one
``hvd.init()``; DDP on the same process group); DDP accumulates K micro-batches under
``no_sync()``, shoal.horovod with ``backward_passes_per_step=K``. Rank 0 writes OUT: for each RUN,
its initial and final weights and the mean seconds per optimizer step after the first 5.
"""

import argparse
import contextlib
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import shoal.horovod as hvd

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("runs", nargs="+")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--width", type=int, default=64)
args = parser.parse_args()

torch.set_num_threads(1)
OPTIONS = {"passes": 1, "fp16": False, "sum": False, "predivide": 1.0, "lr": 0.05}


def parse(run: str) -> tuple[str, dict]:
    mode, *given = run.split(",")
    assert mode in ("hvd", "ddp"), run
    options = dict(OPTIONS)
    for item in given:
        key, _, value = item.partition("=")
        assert key in options, run
        options[key] = type(options[key])(value) if value else True
    return mode, options


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(32, args.width), nn.ReLU(), nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, 10)
    )


def batch(rank: int, step: int, micro: int):
    generator = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
    return torch.randn(16, 32, generator=generator), torch.randint(0, 10, (16,), generator=generator)


def train(mode: str, options: dict) -> dict:
    passes = options["passes"]
    model = build()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=options["lr"], momentum=0.9)
    if mode == "hvd":
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        optimizer = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            compression=hvd.Compression.fp16 if options["fp16"] else hvd.Compression.none,
            backward_passes_per_step=passes,
            op=hvd.Sum if options["sum"] else hvd.Average,
            gradient_predivide_factor=options["predivide"],
        )
        net = model
    else:
        net = DistributedDataParallel(model)
    timings = []
    for step in range(args.steps):
        started = time.perf_counter()
        for micro in range(passes):
            inputs, targets = batch(hvd.rank(), step, micro)
            last = micro == passes - 1
            context = contextlib.nullcontext() if mode == "hvd" or last else net.no_sync()
            with context:
                F.cross_entropy(net(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad()
        timings.append(time.perf_counter() - started)
    return {"state": model.state_dict(), "initial": initial, "step_s": sum(timings[5:]) / len(timings[5:])}


hvd.init()
results = {run: train(*parse(run)) for run in args.runs}
if hvd.rank() == 0:
    torch.save(results, args.out)
hvd.shutdown()
