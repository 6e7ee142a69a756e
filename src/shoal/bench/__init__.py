"""``shoal bench``: how well a job scales on this machine or cluster, and why not better; every figure against a baseline.

One harness (:mod:`shoal.bench.harness`: config -> measure -> rows and notes -> table, JSON, plot) and
one module per benchmark, each declaring only what is its own as a ``BENCHMARK``: its frozen config
dataclass (the command-line flags are generated from its fields), its workers, its rows and its text:

* :mod:`shoal.bench.scaling`: throughput, speedup and efficiency of a ResNet over 1..N processes
  or nodes, with a no-all-reduce control, equal-threads comparison and gradient compression hooks
  (bf16, fp16, PowerSGD) measured beside plain DDP (its per-rank code in :mod:`shoal.bench.scaling_worker`);
* :mod:`shoal.bench.allreduce`: all-reduce latency, algbw and busbw (nccl-tests definitions) beside
  single-process memcpy.

Shared: :mod:`shoal.bench.report` (machine facts, tables, JSON, plots, numbers) and
:mod:`shoal.bench.timing`. The project's own measurements of shoal against its peers (trainer
overhead against Accelerate and Fabric, start-up, data loading, checkpoints, FSDP memory) are not in
the package: they live beside it in ``benchmarks/`` (``python -m benchmarks.NAME``) and use this
harness. ``docs/BENCHMARKS.md`` holds measured numbers with the commands that produced them.
Importing a benchmark module imports no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shoal.bench.harness import Benchmark

BENCHMARKS = {
    "scaling": "throughput, speedup and efficiency over 1..N processes or nodes, with compression hooks",
    "allreduce": "all-reduce latency, algbw and busbw vs memcpy across N processes",
}
"""Every benchmark (a module of this package) with its one-line summary, in the order ``shoal bench --help``
lists them: the table of contents, readable without importing any benchmark."""


def benchmark(name: str) -> Benchmark:
    """The :class:`~shoal.bench.harness.Benchmark` of ``shoal bench NAME``."""
    return importlib.import_module(f"shoal.bench.{name}").BENCHMARK
