"""The memory demo of docs/BENCHMARKS.md ("Memory"), one launch: ``shoal train language --arch large`` under DDP
or FSDP inside a memory cgroup. tests/train/test_fsdp_train.py asserts it at 2 workers;
tests/train/scripts/fsdp_memory_peak.py runs it by hand and prints the peak."""

from __future__ import annotations

import subprocess
import sys

from cgroups import run_in_cgroup

SAMPLES = 2
"""Training windows: at batch 1 on 2 workers, one optimizer step each (was 8, then 4). The memory that
decides the demo is all there in that step: Adam's state is made in ``optimizer.step()`` while the
gradients are still there, beside the parameters; further steps repeat that peak and only add time
(docs/BENCHMARKS.md, "Memory": peaks 2.11 GiB under FSDP, 3.59 GiB under DDP, as 2.15 and 3.76 at 8)."""
LARGE = ["language", "--arch", "large", "--samples", str(SAMPLES), "--batch-size", "1", "--epochs", "1"]
LARGE += ["--device", "cpu", "--checkpoint-every", "off", "--no-progress", "--seed", "0"]


def train_large(cgroup: str, nproc: int, strategy: str, out: str) -> subprocess.CompletedProcess:
    """The large preset on ``nproc`` workers with ``--strategy strategy`` in ``cgroup``, to ``out``."""
    cmd = [sys.executable, "-m", "shoal", "train", *LARGE, "--nproc", str(nproc), "--strategy", strategy]
    # glibc's malloc raises its mmap threshold to the size of the largest block freed (up to 32 MiB),
    # and keeps smaller blocks in its heap afterwards: the whole model FSDP frees after sharding it
    # would stay resident. A fixed threshold returns freed tensors to the system (same for both).
    return run_in_cgroup(cgroup, [*cmd, "--out", out], timeout=900, env={"MALLOC_MMAP_THRESHOLD_": str(128 << 10)})
