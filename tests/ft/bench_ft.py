"""The figures of docs/FAULT_TOLERANCE.md, measured in one run against a baseline of the same run.

    python tests/ft/bench_ft.py [--workload digits] [--epochs 3] [--kills 3]

1. Steady state: ``shoal train W --nproc 2`` (plain DDP, gloo) and ``shoal train W
   --fault-tolerance --nproc 2`` (2 replica groups of one process, torchft): the median
   time of a step (epoch time / steps; the last epochs, the first one holds the start-up).
2. Faults: ``--kills`` runs of ``--fault-tolerance`` where replica group 1 is SIGKILLed right after
   its first commit: the survivor's next commit after the kill, and the restarted group's first
   commit after its process started (both from RUN_DIR/replicas.jsonl).

Prints one JSON document. Not a test: the figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ft_events import events, find, metrics


def _shoal(*args: str) -> list[str]:
    return [sys.executable, "-m", "shoal", "train", *args, "--device", "cpu"]


def _step_s(out: Path, steps_key: str | None) -> float:
    """Median seconds per step over the epochs after the first (training time only where recorded)."""
    per_step = []
    for record in metrics(out)[1:]:
        steps = record[steps_key] if steps_key else record["samples_seen"] / record["global_batch_size"]
        per_step.append(record["samples_seen"] / record["samples_per_s"] / steps)
    return statistics.median(per_step)


def steady_state(workload: str, epochs: int, root: Path) -> dict:
    plain, ft = root / "ddp", root / "ft"
    common = (workload, "--nproc", "2", "--epochs", str(epochs), "--seed", "0")
    subprocess.run(_shoal(*common, "--out", str(plain)), check=True, capture_output=True)
    subprocess.run(_shoal(*common, "--fault-tolerance", "--out", str(ft)), check=True, capture_output=True)
    ddp_s, ft_s = _step_s(plain, None), _step_s(ft, "steps_committed")
    return {"ddp_step_s": ddp_s, "ft_step_s": ft_s, "ratio": ft_s / ddp_s}


def one_fault(workload: str, epochs: int, out: Path) -> dict:
    proc = subprocess.Popen(
        _shoal(workload, "--nproc", "2", "--epochs", str(epochs), "--fault-tolerance", "--out", str(out)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while not find(events(out), 1, "joined"):
            if proc.poll() is not None:
                raise RuntimeError(f"the run ended early ({proc.returncode})")
            time.sleep(0.02)
        victim = find(events(out), 1, "start")[0]["pid"]
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    found = events(out)
    alone = next(e for e in find(found, 0, "quorum") if e["t"] > killed_at)
    second = [e for e in find(found, 1, "joined") if e["pid"] != victim]
    finished = {e["group"]: e["params"] for e in found if e["event"] == "finished"}
    return {
        "survivor_next_commit_s": alone["t"] - killed_at,
        "survivor_dropped_steps": len(find(found, 0, "dropped")),
        "returning_first_commit_s": second[0]["after_s"],
        "weights_equal": finished.get(0) == finished.get(1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="digits")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--kills", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="shoal-ft-bench-") as tmp:
        root = Path(tmp)
        report = {"steady_state": steady_state(args.workload, args.epochs, root)}
        report["faults"] = [one_fault(args.workload, args.epochs, root / f"kill-{i}") for i in range(args.kills)]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
