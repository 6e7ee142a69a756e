"""What losing a node costs an elastic job (docs/BENCHMARKS.md, "Elastic membership"): shoal's
rendezvous settings against torch's defaults, measured in the same run.

    sudo .venv/bin/python tests/cluster/elastic_timing.py --repeat 2

Three pods on one bridge (tests/cluster/pods.py), one ``shoal run --nnodes 2:3 --rdzv-backend c10d
--max-restarts 3 -m shoal train digits`` per pod (one worker each, a run directory every pod sees).
Once epoch 4 is done on 3 nodes, the third pod's launcher is SIGKILLed (its worker dies with it) and
the logs of the two others are polled every 20 ms. Figures, from the kill:

- *node left*: the survivors' launcher line ``node ... left: the job goes on with 2 nodes``
  (the new rendezvous round is complete);
- *resumed*: a restarted worker's ``resuming from`` line (checkpoint loaded, training again);
- *next epoch*: the first epoch record written on 2 nodes; minus one steady epoch (the median
  interval between records on 3 nodes before the kill) it is the time lost.

Two arms alternate in every round: **shoal** (its defaults: heartbeat every 2 s, gone after 3
misses, last call 5 s) and **torch defaults** (``--rdzv-conf keep_alive_interval=5,
keep_alive_max_attempt=3,last_call_timeout=30``, torch's ``DynamicRendezvousHandler`` defaults).
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: cluster.pods

from cluster.helpers import clean_env
from cluster.pods import PodSpec, pod_network

EPOCHS = 8
TORCH_DEFAULTS = "keep_alive_interval=5,keep_alive_max_attempt=3,last_call_timeout=30"
ARMS = {"shoal": [], "torch defaults": ["--rdzv-conf", TORCH_DEFAULTS]}


def _records(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]


def one_run(pods, conf: list[str], work: Path, port: int) -> dict[str, float]:
    out = work / "run"
    endpoint = f"{pods[0].addr}:{port}"
    logs, procs = [], []
    for pod in pods:
        log = work / f"{pod.name}.log"
        cmd = [
            sys.executable, "-m", "shoal", "run", "--nnodes", "2:3", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "timing", "--max-restarts", "3",
            *conf, "-m", "shoal", "train", "digits", "--device", "cpu", "--epochs", str(EPOCHS), "--out", str(out),
        ]  # fmt: skip
        with open(log, "w") as sink:
            procs.append(pod.popen(cmd, env=clean_env(), stdout=sink, stderr=subprocess.STDOUT))
        logs.append(log)
    seen: list[float] = []  # when each epoch record appeared
    try:
        deadline = time.monotonic() + 600
        while not (len(seen) >= 4 and _records(out)[-1]["world_size"] == 3):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise SystemExit("no epoch 4 on 3 nodes:\n" + "\n".join(p.read_text()[-2000:] for p in logs))
            while len(seen) < len(_records(out)):
                seen.append(time.monotonic())
            time.sleep(0.02)
        steady = statistics.median(b - a for a, b in zip(seen[1:], seen[2:]))  # epoch 1 includes the start
        kill, before = time.monotonic(), len(_records(out))
        procs[2].send_signal(signal.SIGKILL)
        procs[2].wait()
        marks: dict[str, float] = {}
        survivors = logs[:2]
        while len(marks) < 3:
            if time.monotonic() - kill > 600:
                raise SystemExit(f"after the kill, only {sorted(marks)}:\n" + "\n".join(p.read_text() for p in logs))
            text = "".join(p.read_text(errors="replace") for p in survivors)
            if "left" not in marks and " left: the job goes on with 2 nodes" in text:
                marks["left"] = time.monotonic() - kill
            if "resumed" not in marks and "resuming from" in text:
                marks["resumed"] = time.monotonic() - kill
            records = _records(out)
            if len(records) > before and records[-1]["world_size"] == 2:
                marks["next_epoch"] = time.monotonic() - kill
            time.sleep(0.02)
        for proc in procs[:2]:
            if proc.wait(timeout=600) != 0:
                raise SystemExit("a survivor failed:\n" + "\n".join(p.read_text()[-3000:] for p in logs))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {**marks, "steady_epoch": steady, "lost": marks["next_epoch"] - steady}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    found: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    load = os.getloadavg()[0]
    names = ["t0", "t1", "t2"]
    specs = [PodSpec(n, resolves={m: m for m in names if m != n}) for n in names]
    with tempfile.TemporaryDirectory(prefix="shoal-elastic-") as tmp, pod_network(specs, tag="el") as net:
        pods = list(net)
        for r in range(args.repeat):
            order = list(ARMS) if r % 2 == 0 else list(ARMS)[::-1]
            for i, arm in enumerate(order):
                work = Path(tmp) / f"r{r}-{arm.replace(' ', '')}"
                work.mkdir()
                got = one_run(pods, ARMS[arm], work, 29700 + 2 * r + i)
                found[arm].append(got)
                print(f"round {r + 1}: {arm}: " + ", ".join(f"{k} {v:.1f} s" for k, v in got.items()), flush=True)
    print(f"\nload average {load:.1f} -> {os.getloadavg()[0]:.1f}; median of {args.repeat} round(s)\n")
    print(
        "| rendezvous settings | kill -> node left | kill -> resumed | kill -> next epoch | steady epoch | time lost |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for arm, runs in found.items():
        m = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
        print(
            f"| {arm} | {m['left']:.1f} s | {m['resumed']:.1f} s | {m['next_epoch']:.1f} s "
            f"| {m['steady_epoch']:.1f} s | {m['lost']:.1f} s |"
        )


if __name__ == "__main__":
    main()
