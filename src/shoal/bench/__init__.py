"""``shoal bench``: how fast, how well it scales, and why not better; every figure against a baseline.

One module per benchmark, each with a frozen ``*Config`` dataclass, a ``run_*`` function returning a
report dict (what ``--json`` writes), a ``format_*`` for the terminal and a ``plot_*`` (matplotlib,
optional):

* :mod:`shoal.bench.scaling`: throughput, speedup and efficiency of a ResNet over 1..N processes,
  with a no-all-reduce control, equal-threads comparison and optional gradient compression;
* :mod:`shoal.bench.allreduce`: all-reduce latency, algbw and busbw (nccl-tests definitions) beside
  single-process memcpy;
* :mod:`shoal.bench.data`: shoal's in-memory loader against the tutorials' per-sample MNIST pipeline
  and raw slicing;
* :mod:`shoal.bench.startup`: time from the command to the first step, against torchrun.

Shared: :mod:`shoal.bench.report` (machine facts, tables, JSON, plots) and :mod:`shoal.bench.timing`.
``docs/BENCHMARKS.md`` holds measured numbers with the commands that produced them.
"""
