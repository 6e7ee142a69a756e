"""The baseline of the GPU check's training figures: a synthetic ResNet step loop under torchrun.

One script, three ways to set the same loop up, so that each pair differs in one thing only:

* ``plain``: what every DDP tutorial writes: ``init_process_group("nccl")``, ``set_device(LOCAL_RANK)``,
  ``DistributedDataParallel`` (at any world size, one included, as the tutorials do), a ``DataLoader`` over a ``TensorDataset`` with ``DistributedSampler``
  and ``pin_memory=True``, ``.to(device, non_blocking=True)``;
* ``library``: the same loop and the same ``DataLoader``, but ``shoal.init()`` and ``ctx.wrap(model)``
  instead of the process group and DDP calls: its step time against ``plain`` is the library's cost
  (with one process ``ctx.wrap`` adds no DDP wrapper, so there the difference is DDP's own);
* ``loader``: ``library`` with ``ctx.loader`` (shoal's batch gatherer into pinned memory) instead of the
  ``DataLoader``: its share of step time spent waiting on data against ``library``'s.

Every way: the same torchvision model, channels-last, bf16 autocast (``--amp bf16``), SGD with momentum,
random images drawn from one seed. Timing: ``--warmup`` untimed steps, then ``--steps`` steps between two
``torch.cuda.synchronize()`` (the GPU's work included); the data wait is the host time spent in
``next()`` of the loader. Rank 0 writes one JSON object (``--json``) and prints it.

    torchrun --nproc-per-node 1 scripts/gpu/resnet_ddp.py --mode plain --json plain.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

MODES = ("plain", "library", "loader")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=MODES, default="plain")
    parser.add_argument("--arch", default="resnet50")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=64, help="per process")
    parser.add_argument("--samples", type=int, default=1024, help="in the dataset (global)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--amp", choices=("off", "bf16"), default="bf16")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: to check the script only")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    ctx, device, rank, world = _setup(args)
    torch.manual_seed(0)
    model = torchvision.models.get_model(args.arch, num_classes=10).to(memory_format=torch.channels_last)
    model = ctx.wrap(model) if ctx is not None else _plain_ddp(model, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    generator = torch.Generator().manual_seed(0)
    side = args.image_size
    images = torch.randn((args.samples, 3, side, side), generator=generator)
    labels = torch.randint(0, 10, (args.samples,), generator=generator)
    if args.mode == "loader":
        loader = ctx.loader((images, labels), args.batch_size)
    else:
        sampler = DistributedSampler(range(args.samples), num_replicas=world, rank=rank, seed=0)
        pin = device.type == "cuda"
        loader = DataLoader(TensorDataset(images, labels), args.batch_size, sampler=sampler, pin_memory=pin)

    batches = _endless(loader, sampler=None if args.mode == "loader" else loader.sampler)
    wait_s = 0.0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            _sync(device)
            wait_s, started = 0.0, time.perf_counter()
        fetching = time.perf_counter()
        inputs, targets = next(batches)
        inputs = inputs.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
        targets = targets.to(device, non_blocking=True)
        wait_s += time.perf_counter() - fetching
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp == "bf16"):
            loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    _sync(device)
    seconds = time.perf_counter() - started
    result = {
        "mode": args.mode,
        "arch": args.arch,
        "world_size": world,
        "batch_size": args.batch_size,
        "steps": args.steps,
        "step_ms": seconds / args.steps * 1e3,
        "samples_per_s": args.steps * args.batch_size * world / seconds,
        "data_wait_share": wait_s / seconds,
        "loss": float(loss),
        "peak_device_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0,
    }
    if rank == 0:
        print(json.dumps(result), flush=True)
        if args.json:
            args.json.write_text(json.dumps(result, indent=1) + "\n")
    if ctx is not None:
        ctx.shutdown()
    elif dist.is_initialized():
        dist.destroy_process_group()


def _setup(args):
    """(shoal's context or None, device, rank, world size), the way the mode says."""
    if args.mode != "plain":
        import shoal

        ctx = shoal.init(device=args.device)
        return ctx, ctx.device, ctx.rank, ctx.world_size
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    # As the tutorials do, whatever the world size (torchrun sets the variables it reads).
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return None, device, rank, world


def _plain_ddp(model, device):
    return DistributedDataParallel(model.to(device), device_ids=[device.index] if device.type == "cuda" else None)


def _endless(loader, sampler):
    """Batches forever, a new epoch (``set_epoch`` for a DistributedSampler) whenever one ends."""
    epoch = 0
    while True:
        if sampler is not None:
            sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


if __name__ == "__main__":
    main()
