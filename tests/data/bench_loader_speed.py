"""Samples/s of TensorBatchLoader against raw slicing, on an MNIST-sized in-memory tensor.

Not collected by pytest (no ``test_`` prefix). Run:

    python tests/data/bench_loader_speed.py [--epochs 3] [--batch 128] [--threads N] [--clock cpu]

Baselines, measured in the same run on the same tensors, interleaved epoch by epoch:
* raw ``X[perm[i:i+B]]`` (advanced indexing), the loop most tutorials write;
* raw ``X.index_select(0, perm[i:i+B])``, the fastest hand-written loop (what the loader does).
Every variant reshuffles per epoch (``randperm``, this rank's strided shard) and gathers the labels
too, as a training loop would. Reported: the best epoch of each. On a shared machine use
``--threads 1 --clock cpu``: CPU time of one thread is far steadier than wall time.
"""

from __future__ import annotations

import argparse
import time

import torch

from shoal.data import make_loader

N = 60_000


def measure(run, clock) -> float:
    """Samples/s of one timed call of ``run`` (which returns a sample count)."""
    t0 = clock()
    n = run()
    return n / (clock() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: perf_counter; cpu: process CPU time (steadier on a shared machine, with --threads 1)",
    )
    args = ap.parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    if args.threads:
        torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    # Normalised MNIST-like images (float32, 1x28x28) and int64 labels, pre-loaded in memory.
    x = ((torch.rand(N, 1, 28, 28, generator=g) - 0.1307) / 0.3081).contiguous()
    y = torch.randint(0, 10, (N,), generator=g)
    B = args.batch
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, X {tuple(x.shape)} float32, "
        f"batch {B}, {args.clock} clock, best of {args.epochs} epochs"
    )

    for world, rank in ((1, 0), (2, 0)):
        loader = make_loader((x, y), B, rank=rank, world_size=world, shuffle=True, seed=0)
        per_rank = len(loader.sampler)
        shuffle = torch.Generator().manual_seed(1)

        # The hand-written loops reshuffle every epoch too (a training loop must), and take this
        # rank's strided shard of the permutation, so all three do the same work per epoch.
        def raw_index() -> int:
            perm = torch.randperm(N, generator=shuffle)[rank::world]
            for i in range(0, len(perm), B):
                j = perm[i : i + B]
                xb, yb = x[j], y[j]
            return len(perm)

        def raw_select() -> int:
            perm = torch.randperm(N, generator=shuffle)[rank::world]
            for i in range(0, len(perm), B):
                j = perm[i : i + B]
                xb, yb = x.index_select(0, j), y.index_select(0, j)
            return len(perm)

        def shoal_loader() -> int:
            n = 0
            for xb, yb in loader:  # a fresh epoch (new shuffle) each call
                n += len(xb)
            return n

        # Interleave the variants so drift (turbo, other load) hits all of them alike.
        rates = {"raw X[perm[i:i+B]]": 0.0, "raw index_select": 0.0, "TensorBatchLoader": 0.0}
        for _ in range(args.epochs):
            for name, fn in zip(rates, (raw_index, raw_select, shoal_loader)):
                rates[name] = max(rates[name], measure(fn, clock))
        base = rates["raw X[perm[i:i+B]]"]
        print(f"\nworld_size={world} rank={rank}: {per_rank} samples/epoch on this rank")
        for name, rate in rates.items():
            print(f"  {name:<22} {rate:>12,.0f} samples/s   {rate / base:5.2f}x raw X[perm[i:i+B]]")
        ratio = rates["TensorBatchLoader"] / rates["raw index_select"]
        print(f"  TensorBatchLoader / raw index_select: {ratio:.2f}x")


if __name__ == "__main__":
    main()
