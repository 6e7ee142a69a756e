"""MNIST with DistributedDataParallel, the tutorials' way: a per-sample data pipeline.

This is the plain-PyTorch recipe that the PyTorch DDP / "single-node multi-GPU MNIST" tutorials
teach: ``torchvision.datasets.MNIST`` with ``ToTensor()`` + ``Normalize`` applied to one sample at a
time, a ``DistributedSampler`` and a ``DataLoader`` that collates 64 samples into a batch.

It trains the same small CNN with the same settings as ``shoal train mnist`` (4 epochs, batch 64
per process, AdamW lr 4e-3, weight decay 1e-4, cosine learning-rate decay per step, no warm-up)
and evaluates on the full 10k test set after every epoch, so the two can be compared on wall
time and accuracy: it is the baseline that shoal's in-memory loader is compared with in
docs/BENCHMARKS.md. It does not import shoal.

Run it (DIR is the torchvision root: DIR/MNIST/raw holds the four uncompressed idx files):

    shoal run --nproc 2 examples/mnist_per_sample.py --data DIR
    torchrun --standalone --nproc-per-node 2 examples/mnist_per_sample.py --data DIR
    python examples/mnist_per_sample.py --data DIR          # one process, no process group

Rank 0 prints one line per epoch and the time to reach the target test accuracy:

    epoch 1/4  test_acc 0.9812  train_s 14.2  elapsed 17.9
    ...
    time to target 0.99: 45.6 s (epoch 3)

"elapsed" counts from the start of the process (before ``import torch``), so it includes start-up,
data loading and evaluation. ``--json PATH`` writes the same numbers as JSON.
"""

import time

START = time.time()  # before importing torch: elapsed times include the start-up

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, Subset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402
from torchvision import datasets, transforms  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description="MNIST with DDP and the tutorials' per-sample data pipeline")
    parser.add_argument("--data", required=True, help="torchvision root: DIR/MNIST/raw holds the four idx files")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64, help="per process")
    parser.add_argument("--lr", type=float, default=4e-3)
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes per rank")
    parser.add_argument("--target", type=float, default=0.99, help="test accuracy to time")
    parser.add_argument("--limit", type=int, default=None, help="train on only the first N samples")
    parser.add_argument("--json", default=None, metavar="PATH", help="write a JSON summary here (rank 0)")
    return parser.parse_args()


def build_model():
    # The same layers as shoal's mnist workload (src/shoal/workloads/mnist.py).
    num_classes = 10
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),  # 28 -> 14
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),  # 14 -> 7
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, num_classes),
    )


def cosine_lr(base_lr, progress, epochs):
    """Cosine decay from base_lr to 0 over the run; progress is in epochs (fractional)."""
    return base_lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress / epochs)))


@torch.no_grad()
def evaluate(model, loader, device):
    model.eval()
    correct = total = 0
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        correct += (model(images).argmax(dim=1) == labels).sum().item()
        total += labels.numel()
    return correct / total


def main():
    args = parse_args()

    # Distributed setup from the variables torchrun (or shoal run) sets; one process without them.
    distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))

    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if distributed:
        dist.init_process_group(backend=backend)

    # Threads: OMP_NUM_THREADS if set, else this process's share of the usable cores.
    if "OMP_NUM_THREADS" in os.environ:
        threads = max(1, int(os.environ["OMP_NUM_THREADS"]))
    else:
        threads = max(1, len(os.sched_getaffinity(0)) // local_world_size)
    torch.set_num_threads(threads)

    # Data: a PIL image -> tensor -> normalized tensor, one sample at a time.
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    train_set = datasets.MNIST(args.data, train=True, transform=transform, download=False)
    if args.limit is not None:
        train_set = Subset(train_set, range(min(args.limit, len(train_set))))
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    train_loader = DataLoader(
        train_set,
        batch_size=args.batch_size,
        sampler=sampler,
        num_workers=args.num_workers,
        pin_memory=device.type == "cuda",
    )
    test_loader = None
    if rank == 0:
        test_set = datasets.MNIST(args.data, train=False, transform=transform, download=False)
        test_loader = DataLoader(test_set, batch_size=1000, num_workers=args.num_workers)

    # Model, DDP, optimizer.
    torch.manual_seed(0)
    model = build_model().to(device)
    ddp_model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None) if distributed else model
    optimizer = torch.optim.AdamW(ddp_model.parameters(), lr=args.lr, weight_decay=1e-4)
    steps_per_epoch = len(train_loader)

    history = []
    time_to_target = target_epoch = None
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        ddp_model.train()
        started = time.time()
        for step, (images, labels) in enumerate(train_loader):
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            lr = cosine_lr(args.lr, epoch + step / steps_per_epoch, args.epochs)
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(ddp_model(images), labels)
            loss.backward()
            optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        train_s = time.time() - started

        if rank == 0:
            accuracy = evaluate(model, test_loader, device)  # the unwrapped model: no collectives
            elapsed = time.time() - START
            history.append({"epoch": epoch + 1, "test_acc": accuracy, "train_s": train_s, "elapsed": elapsed})
            print(
                f"epoch {epoch + 1}/{args.epochs}  test_acc {accuracy:.4f}  train_s {train_s:.1f}  "
                f"elapsed {elapsed:.1f}",
                flush=True,
            )
            if time_to_target is None and accuracy >= args.target:
                time_to_target, target_epoch = elapsed, epoch + 1
        if distributed:
            dist.barrier()  # the other ranks wait for rank 0's evaluation

    if rank == 0:
        if time_to_target is not None:
            print(f"time to target {args.target}: {time_to_target:.1f} s (epoch {target_epoch})", flush=True)
        else:
            print(f"target {args.target} not reached", flush=True)
        if args.json:
            summary = {
                "script": "mnist_per_sample",
                "epochs": history,
                "target": args.target,
                "time_to_target": time_to_target,
                "target_epoch": target_epoch,
                "world_size": world_size,
                "threads": threads,
                "batch_size": args.batch_size,
                "lr": args.lr,
                "num_workers": args.num_workers,
                "train_samples": len(train_set),
                "device": str(device),
                "total_s": time.time() - START,
            }
            with open(args.json, "w") as f:
                json.dump(summary, f, indent=2)
                f.write("\n")

    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
