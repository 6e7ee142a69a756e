"""``shoal bench``: how fast, how well it scales, and why not better; every figure against a baseline.

One harness (:mod:`shoal.bench.harness`: config -> measure -> rows and notes -> table, JSON, plot) and
one module per benchmark, each declaring only what is its own as a ``BENCHMARK``: its frozen config
dataclass (the command-line flags are generated from its fields), its workers, its rows and its text:

* :mod:`shoal.bench.scaling`: throughput, speedup and efficiency of a ResNet over 1..N processes
  or nodes, with a no-all-reduce control, equal-threads comparison and gradient compression hooks
  (bf16, fp16, PowerSGD) measured beside plain DDP (its per-rank code in :mod:`shoal.bench.scaling_worker`);
* :mod:`shoal.bench.allreduce`: all-reduce latency, algbw and busbw (nccl-tests definitions) beside
  single-process memcpy;
* :mod:`shoal.bench.overhead`: shoal's trainer against a hand-written DDP loop, Accelerate, Fabric and
  ``shoal.horovod``, with bit-identical weights (its workers in :mod:`shoal.bench.overhead_workers`);
* :mod:`shoal.bench.data`: shoal's in-memory loader against the tutorials' per-sample MNIST pipeline
  and raw slicing;
* :mod:`shoal.bench.startup`: time from the command to the first step, against torchrun (the probe it
  times is :mod:`shoal.bench.probes.startup_probe`);
* :mod:`shoal.bench.checkpoint`: save/load MB/s of shoal's atomic, durable writer against ``torch.save``;
* :mod:`shoal.bench.memory`: per-rank bytes of parameters, gradients and optimizer state under FSDP
  against DDP, with peak RSS and step time.

Shared: :mod:`shoal.bench.report` (machine facts, tables, JSON, plots, numbers) and
:mod:`shoal.bench.timing`. ``docs/BENCHMARKS.md`` holds measured numbers with the commands that
produced them. Importing a benchmark module imports no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shoal.bench.harness import Benchmark

BENCHMARKS = {
    "scaling": "throughput, speedup and efficiency over 1..N processes or nodes, with compression hooks",
    "allreduce": "all-reduce latency, algbw and busbw vs memcpy across N processes",
    "overhead": "shoal's trainer vs a hand-written DDP loop, Accelerate, Fabric and shoal.horovod: ms/step",
    "data": "samples/s of shoal's loader vs the tutorials' per-sample MNIST pipeline",
    "startup": "time from the command to the first step on every rank, vs torchrun",
    "checkpoint": "save/load MB/s of shoal's atomic, durable checkpoint writer vs plain torch.save",
    "memory": "per-rank bytes of parameters, gradients and optimizer state, DDP vs FSDP, with step time",
}
"""Every benchmark (a module of this package) with its one-line summary, in the order ``shoal bench --help``
lists them: the table of contents, readable without importing any benchmark."""


def benchmark(name: str) -> Benchmark:
    """The :class:`~shoal.bench.harness.Benchmark` of ``shoal bench NAME``."""
    return importlib.import_module(f"shoal.bench.{name}").BENCHMARK
