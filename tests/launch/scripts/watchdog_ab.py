"""Watchdog on vs off, same machine, same run: ``shoal train WORKLOAD --nproc 2`` alternately with
``SHOAL_WATCHDOG=0`` (no progress directory, no monitor) and without (the default: on).

    python tests/launch/scripts/watchdog_ab.py [--workload digits] [--epochs 40] [--pairs 4] [-- EXTRA FLAGS]

Per run: the median ``epoch_s`` of epochs 2.. from metrics.jsonl (epoch 1 warms up); printed: each
pair, then the ratio of the medians, the median of the pairs' ratios, and the ratio of the minimums
(the least disturbed run of each side: on a shared, loaded machine the only one that resolves 1 %).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def one_run(workload: str, epochs: int, on: bool, extra: list[str]) -> float:
    out = Path(tempfile.mkdtemp(prefix="watchdog-ab-"))
    env = dict(os.environ, SHOAL_WATCHDOG="1" if on else "0")
    cmd = [sys.executable, "-m", "shoal", "train", workload, "--nproc", "2", "--epochs", str(epochs), "--out", str(out)]
    subprocess.run([*cmd, *extra], check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    epochs_s = [json.loads(line)["epoch_s"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    shutil.rmtree(out, ignore_errors=True)
    return statistics.median(epochs_s[1:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="digits")
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("extra", nargs="*")
    args = parser.parse_args()
    on, off = [], []
    for pair in range(args.pairs):
        order = (True, False) if pair % 2 == 0 else (False, True)
        for flag in order:
            (on if flag else off).append(one_run(args.workload, args.epochs, flag, args.extra))
        print(
            f"pair {pair + 1}: on {on[-1] * 1e3:.1f} ms/epoch, off {off[-1] * 1e3:.1f} ms/epoch, ratio {on[-1] / off[-1]:.3f}",
            flush=True,
        )
    ratios = [a / b for a, b in zip(on, off)]
    print(
        f"{args.workload}, 2 ranks: on {statistics.median(on) * 1e3:.1f} ms/epoch vs off {statistics.median(off) * 1e3:.1f} "
        f"ms/epoch: ratio of medians {statistics.median(on) / statistics.median(off):.3f}, "
        f"median of pair ratios {statistics.median(ratios):.3f}, ratio of minimums {min(on) / min(off):.3f}"
    )


if __name__ == "__main__":
    main()
