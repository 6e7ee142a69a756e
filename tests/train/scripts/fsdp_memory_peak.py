"""The memory demo of docs/SHARDING.md by hand: the test's launch (tests/train/memory_demo.py) in a
fresh memory cgroup (tests/cgroups.py), then the exit status, the seconds and the cgroup's peak
usage. Root and a writable memory cgroup needed.

Usage (from the repository root): python tests/train/scripts/fsdp_memory_peak.py NPROC LIMIT_MIB ddp|fsdp
"""

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: cgroups
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/train/: memory_demo
from memory_demo import train_large

from cgroups import memory_cgroup

nproc, limit_mib, strategy = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
out = tempfile.mkdtemp(prefix="fsdp-memory-")
try:
    with memory_cgroup(limit_mib << 20, "peak") as cgroup:
        started = time.time()
        proc = train_large(cgroup, nproc, strategy, os.path.join(out, "run"))
        seconds = time.time() - started
        peaks = [os.path.join(cgroup, n) for n in ("memory.max_usage_in_bytes", "memory.peak")]
        peak = next(int(Path(p).read_text()) for p in peaks if os.path.exists(p)) / 2**30
    summary = next((line for line in proc.stderr.splitlines() if line.startswith("shoal: error:")), "")
    print(
        f"nproc {nproc} {strategy}, limit {limit_mib} MiB: exit {proc.returncode} in {seconds:.1f} s, peak {peak:.2f} GiB"
    )
    if summary:
        print(summary)
finally:
    shutil.rmtree(out, ignore_errors=True)
