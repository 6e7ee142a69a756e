"""The project's own measurements of shoal against its peers, beside the package (not installed with it).

Each module is one benchmark, run from the repository root as ``python -m benchmarks.NAME`` (``--help``
lists its flags, ``--smoke`` runs it in seconds). They go through the installed package's harness
(:mod:`shoal.bench.harness`: flags from the config's fields, table, JSON, plot), as ``shoal bench
scaling`` and ``allreduce`` do, and measure what ``docs/BENCHMARKS.md`` reports:

* :mod:`benchmarks.overhead`: shoal's trainer against a hand-written DDP loop, Accelerate, Fabric and
  ``shoal.horovod``, with bit-identical weights (its workers in :mod:`benchmarks.overhead_workers`);
* :mod:`benchmarks.data`: shoal's in-memory loader against the tutorials' per-sample MNIST pipeline
  and raw slicing;
* :mod:`benchmarks.startup`: time from the command to the first step, against torchrun (the probe it
  times is :mod:`benchmarks.startup_probe`);
* :mod:`benchmarks.checkpoint`: save/load MB/s of shoal's atomic, durable writer against ``torch.save``
  (the state it saves in :mod:`benchmarks.checkpoint_state`);
* :mod:`benchmarks.memory`: per-rank bytes of parameters, gradients and optimizer state under FSDP
  against DDP, with peak RSS and step time.

:mod:`benchmarks.peers` skips the rows of frameworks that are not installed
(``pip install -r benchmarks/requirements.txt``). The package never imports this one (an
import-linter contract); importing a benchmark module imports no torch.
"""

from __future__ import annotations

import importlib


def main(name: str, argv: list[str] | None = None) -> int:
    """``python -m benchmarks.NAME ARGV``: parse, measure, print the table, write the JSON and plot.

    The module is imported under its package name, not run as ``__main__``: workers started by spawn
    unpickle its functions from ``benchmarks.NAME``.
    """
    from shoal.cli.bench import main as benchmark_main

    return benchmark_main(importlib.import_module(f"benchmarks.{name}").BENCHMARK, argv)
