"""``python -m benchmarks.data``: samples/s of shoal's in-memory loader against the tutorials' MNIST pipeline.

Three ways to get shuffled MNIST batches of the same size, in one process, interleaved pass by
pass (median of ``--repeat``):

* ``shoal``: what ``shoal train mnist`` does: the 60000x1x28x28 images decoded and normalized once
  into one float tensor, then ``shoal.data.make_loader`` over ``(images, labels)`` (one gather per
  batch, no per-sample Python);
* ``per_sample``: the tutorials' pipeline: ``torchvision.datasets.MNIST(root, transform=Compose(
  [ToTensor(), Normalize((0.1307,), (0.3081,))]))`` through ``DataLoader(batch_size=B,
  shuffle=True)``: a PIL image, a tensor and a normalization per sample, then a collate per batch;
* ``slicing``: the ceiling the tutorials quote: ``X[perm[i:i+B]]``, ``y[perm[i:i+B]]`` on the same
  normalized tensor, a fresh ``randperm`` per pass;
* ``index_select``: the same loop with ``X.index_select(0, perm[i:i+B])``: the fastest hand-written
  loop (advanced indexing ``X[idx]`` is slower than ``index_select`` on CPU), and what shoal's
  loader does inside; so the loader can beat "slicing".

Without ``--data DIR`` the images are random uint8 of MNIST's shape written as MNIST's own files
(idx format) into a temporary ``MNIST/raw``, so all three read them through torchvision's real
MNIST class: the per-sample work is the same as on real digits (decoding cost does not depend on
pixel values). ``--data DIR`` uses real MNIST in torchvision's layout (``DIR/MNIST/raw``).
Setup (reading the files, and for ``shoal``/``slicing`` normalizing once) is timed separately.
"""

from __future__ import annotations

import struct
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.bench import report as rep
from shoal.bench.harness import Benchmark, Log, Measured, require_at_least
from shoal.bench.timing import median, rotations
from shoal.errors import ShoalError

MEAN, STD = 0.1307, 0.3081  # the canonical MNIST statistics (as in shoal.workloads.mnist)
TRAIN_SIZE = 60_000
VARIANTS = ("shoal", "per_sample", "slicing", "index_select")


@dataclass(frozen=True)
class DataConfig:
    """What ``python -m benchmarks.data`` measures."""

    data: str | None = None
    """Real MNIST root (torchvision's layout: DIR/MNIST/raw); default: random images in MNIST's files."""
    batch_size: int = 64
    """Samples per batch, the same for every variant (64: the PyTorch MNIST example's)."""
    samples: int = TRAIN_SIZE
    """Samples per timed pass (at most the training set: one epoch by default)."""
    train_size: int = TRAIN_SIZE
    """Images in the generated stand-in dataset (ignored with --data)."""
    repeat: int = 3
    """Timed passes per variant, interleaved; the median is reported."""
    num_workers: int = 0
    """DataLoader workers of the per-sample pipeline (0, as in the tutorials)."""
    threads: int = 1
    """torch intra-op threads; 0: torch's own choice (all cores).

    One by default: a batch gather is small and memory-bound, and on a busy machine a second OpenMP
    thread that is not scheduled makes every gather wait for it (measured: ~10,000 instead of
    ~450,000 samples/s of raw slicing on a loaded 2-core machine, see docs/BENCHMARKS.md)."""

    def __post_init__(self) -> None:
        require_at_least(self, 1, "batch_size", "samples", "train_size", "repeat")
        if self.num_workers < 0 or self.threads < 0:
            raise ShoalError("--num-workers and --threads must be 0 or more", "pass 0 for the defaults")


SMOKE = dict(samples=1024, train_size=2048, repeat=1)
"""``--smoke``: a 2048-image stand-in, 1024 samples per pass, one pass each."""


def write_fake_mnist(root: Path, train_size: int, *, test_size: int = 16, seed: int = 0) -> Path:
    """Random uint8 images and labels of MNIST's shape, as MNIST's four idx files in ``root/MNIST/raw``."""
    import torch

    raw = Path(root) / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    for split, n in (("train", train_size), ("t10k", test_size)):
        images = torch.randint(0, 256, (n, 28, 28), dtype=torch.uint8, generator=gen)
        labels = torch.randint(0, 10, (n,), dtype=torch.uint8, generator=gen)
        # idx format: magic (0x0803 images / 0x0801 labels: unsigned bytes, 3 or 1 dims), big-endian sizes.
        (raw / f"{split}-images-idx3-ubyte").write_bytes(
            struct.pack(">IIII", 0x0803, n, 28, 28) + images.numpy().tobytes()
        )
        (raw / f"{split}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 0x0801, n) + labels.numpy().tobytes())
    return Path(root)


def _check_root(root: Path) -> None:
    from shoal.workloads.mnist import RAW_FILES

    raw = root / "MNIST" / "raw"
    missing = [name for name in RAW_FILES if not (raw / name).is_file()]
    if missing:
        raise ShoalError(
            f"MNIST not found in {raw}: missing {', '.join(missing)}",
            "put the four (uncompressed) MNIST files in DIR/MNIST/raw and pass --data DIR, "
            "or `shoal train mnist --data DIR` once to extract .gz files there",
        )


def measure(cfg: DataConfig, log: Log) -> Measured:
    """Every loader over the same files, pass by pass, interleaved (with this process's threads set)."""
    import torch

    threads_before = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        with tempfile.TemporaryDirectory(prefix="shoal-bench-data-") as tmp:
            if cfg.data:
                root = Path(cfg.data).expanduser()
                _check_root(root)
                source = f"real MNIST from {root}"
            else:
                root = write_fake_mnist(Path(tmp), cfg.train_size)
                source = f"random uint8 images of MNIST's shape ({cfg.train_size}x28x28) in MNIST's file format"
            return _measure(cfg, root, source, log)
    finally:
        torch.set_num_threads(threads_before)  # a library call leaves the caller's threads alone


def _measure(cfg: DataConfig, root: Path, source: str, log: Log) -> Measured:
    import torch
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms

    from shoal.data import make_loader

    setup: dict[str, float] = {}
    start = time.perf_counter()
    tutorial = datasets.MNIST(
        str(root),
        train=True,
        download=False,
        transform=transforms.Compose([transforms.ToTensor(), transforms.Normalize((MEAN,), (STD,))]),
    )
    setup["per_sample"] = time.perf_counter() - start
    start = time.perf_counter()
    raw = datasets.MNIST(str(root), train=True, download=False)
    images = ((raw.data.float() / 255.0 - MEAN) / STD).unsqueeze(1).contiguous()  # as shoal.workloads.mnist
    labels = raw.targets.long()
    setup["shoal"] = setup["slicing"] = setup["index_select"] = time.perf_counter() - start
    n = len(images)
    samples = min(cfg.samples, n)
    batches = -(-samples // cfg.batch_size)
    b = cfg.batch_size

    shoal_loader = make_loader((images, labels), b, rank=0, world_size=1, shuffle=True, seed=0)
    tutorial_loader = DataLoader(tutorial, batch_size=b, shuffle=True, num_workers=cfg.num_workers)

    def take(batch_iter: Iterator) -> int:
        count = 0
        for i, (x, _y) in enumerate(batch_iter):
            count += len(x)
            if i + 1 >= batches:
                break
        return count

    def slicing() -> Iterator:
        perm = torch.randperm(n)
        for i in range(0, n, b):
            idx = perm[i : i + b]
            yield images[idx], labels[idx]

    def index_select() -> Iterator:
        perm = torch.randperm(n)
        for i in range(0, n, b):
            idx = perm[i : i + b]
            yield images.index_select(0, idx), labels.index_select(0, idx)

    fresh = {
        "shoal": lambda: iter(shoal_loader),
        "per_sample": lambda: iter(tutorial_loader),
        "slicing": slicing,
        "index_select": index_select,
    }

    passes = {name: (lambda name=name: take(fresh[name]())) for name in VARIANTS}
    for name in VARIANTS:  # untimed: first calls load kernels and fill caches
        for i, _ in enumerate(fresh[name]()):
            if i + 1 >= min(batches, 4):
                break
    runs: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for order in rotations(VARIANTS, cfg.repeat):
        for name in order:
            start = time.perf_counter()
            count = passes[name]()
            runs[name].append(count / (time.perf_counter() - start))
        log("  pass done: " + ", ".join(f"{v} {rep.rate(runs[v][-1])}/s" for v in VARIANTS))
    x, y = next(iter(shoal_loader))
    per_sample = median(runs["per_sample"])
    ceiling = median(runs["slicing"])
    descriptions = {
        "shoal": "shoal.data.make_loader over pre-loaded normalized tensors",
        "per_sample": f"torchvision MNIST + ToTensor/Normalize, DataLoader(shuffle=True, num_workers={cfg.num_workers})",
        "slicing": "X[perm[i:i+B]] on the same tensors (the tutorials' ceiling)",
        "index_select": "X.index_select(0, perm[i:i+B]): the fastest hand-written loop",
    }
    rows = [
        {
            "variant": v,
            "description": descriptions[v],
            "samples_per_s": median(runs[v]),
            "samples_per_s_runs": runs[v],
            "vs_per_sample": median(runs[v]) / per_sample,
            "vs_slicing": median(runs[v]) / ceiling,
            "setup_s": setup[v],
        }
        for v in VARIANTS
    ]
    shoal_row = rows[0]
    note = (
        f"shoal's loader: {shoal_row['vs_per_sample']:.0f}x the per-sample pipeline, "
        f"{shoal_row['vs_slicing']:.0%} of raw slicing, "
        f"{shoal_row['samples_per_s'] / median(runs['index_select']):.0%} of a hand-written index_select loop "
        f"(batch {b}, {torch.get_num_threads()} thread(s))"
    )
    config = {
        "samples": samples,
        "batches_per_pass": batches,
        "threads": torch.get_num_threads(),
        "dataset_size": n,
        "source": source,
    }
    extra = {"shoal_batch_shape": list(x.shape), "shoal_batch_dtype": str(x.dtype)}
    return Measured(rows, [note], config=config, extra=extra)


def text(report: dict[str, Any]) -> list[str]:
    cfg = report["config"]
    return [
        f"{cfg['source']}; batch {cfg['batch_size']}, {cfg['samples']} samples per pass, median of "
        f"{cfg['repeat']} interleaved passes, {cfg['threads']} torch thread(s)",
        "",
        rep.table(
            ["loader", "samples/s", "vs per-sample", "vs slicing", "setup (s)", "what"],
            [
                [
                    r["variant"],
                    rep.rate(r["samples_per_s"]),
                    f"{r['vs_per_sample']:.1f}x",
                    f"{r['vs_slicing']:.0%}",
                    f"{r['setup_s']:.2f}",
                    r["description"],
                ]
                for r in report["rows"]
            ],
            align="lrrrrl",
        ),
    ]


def draw(ax: Any, report: dict[str, Any]) -> None:
    rows = report["rows"]
    values = [r["samples_per_s"] for r in rows]
    ax.barh([r["variant"] for r in rows], values)
    ax.set_xscale("log")
    ax.set_xlabel("samples/s (log scale)")
    ax.set_title(f"MNIST batches of {report['config']['batch_size']}, one process")
    for i, v in enumerate(values):
        ax.text(v, i, f" {rep.rate(v)}", va="center")


BENCHMARK = Benchmark(
    name="data",
    command="python -m benchmarks.data",
    config=DataConfig,
    smoke=SMOKE,
    measure=measure,
    text=text,
    draw=draw,
    description="Shuffled MNIST batches three ways in one process: shoal's in-memory loader, torchvision's "
    "MNIST with ToTensor/Normalize through a DataLoader (the tutorials' pipeline), and raw "
    "X[perm[i:i+B]] slicing (the ceiling).",
    examples="""\
examples:
  python -m benchmarks.data                  # random images in MNIST's files (no download)
  python -m benchmarks.data --data ~/data    # real MNIST in ~/data/MNIST/raw
  python -m benchmarks.data --batch-size 128 --samples 20000 --repeat 5
  python -m benchmarks.data --num-workers 2  # give the per-sample pipeline worker processes
  python -m benchmarks.data --smoke --json data.json
""",
)


if __name__ == "__main__":
    from benchmarks import main

    raise SystemExit(main("data"))
