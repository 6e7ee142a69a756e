"""Rendezvous to first step across namespace nodes (docs/BENCHMARKS.md), against the same number of
workers on one node, measured in the same run.

    sudo .venv/bin/python tests/doctor/rendezvous_timing.py --nodes 2,4,8,16 --repeat 3

For each N: N pods on one bridge (tests/cluster/pods.py), one ``shoal run --nnodes N --nproc 1``
per pod (static rendezvous, node 0 hosts it) running shoal bench's startup probe (join a gloo
group, one DDP step of a tiny model with its gradient all-reduce and the optimizer step, then each
rank writes ``time.time()``); then, as the baseline, ``shoal run --nproc N`` in one pod running
the same probe. Figures, per run:

- rendezvous -> first step: from the moment the last launcher printed that its workers start
  (``rendezvous done; starting rank ...``, or on one node ``N workers on this node, rendezvous ...``,
  seen by polling the logs every 20 ms) to the last rank's stamp: the workers' start (a fresh
  interpreter importing torch), the process group across the nodes, the first step;
- start -> rendezvous: from starting the launchers (all at once) to that moment: importing torch in
  every launcher and the rendezvous itself.

The medians of ``--repeat`` rounds are printed as a Markdown table (rounds interleave the node
counts, and within a node count the multi-node run and its baseline), with the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: cluster.pods

from cluster.helpers import clean_env
from cluster.pods import PodSpec, pod_network

PROBE = str(Path(__file__).resolve().parents[2] / "benchmarks" / "startup_probe.py")
MARKERS = ("rendezvous done; starting", "workers on this node, rendezvous")


def one_run(pods, nnodes: int, work: Path) -> dict[str, float]:
    """Start the launchers (one per pod given; one pod: N local workers); seconds to each milestone."""
    out = work / "stamps"
    out.mkdir(parents=True)
    several = len(pods) > 1
    logs, procs = [], []
    start = time.time()
    for i, pod in enumerate(pods):
        if several:
            launch = ["--nnodes", str(nnodes), "--node-rank", str(i), "--master-addr", "n0", "--nproc", "1"]
        else:
            launch = ["--nproc", str(nnodes)]
        log = work / f"{pod.name}.log"
        with open(log, "w") as f:
            cmd = [sys.executable, "-m", "shoal", "run", *launch, "--join-timeout", "600", PROBE, str(out)]
            procs.append(pod.popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=clean_env()))
        logs.append(log)
    marked: dict[Path, float] = {}
    while any(p.poll() is None for p in procs):
        for log in logs:
            if log not in marked and any(m in log.read_text(errors="replace") for m in MARKERS):
                marked[log] = time.time()
        time.sleep(0.02)
    if any(p.returncode for p in procs) or len(marked) != len(logs):
        raise SystemExit("a run failed:\n" + "\n".join(f"== {log}\n{log.read_text()[-3000:]}" for log in logs))
    first_step = max(float(p.read_text()) for p in out.glob("rank*.txt"))
    rendezvous = max(marked.values())
    return {"rendezvous_s": rendezvous - start, "to_first_step_s": first_step - rendezvous}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="2,4,8,16")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    counts = [int(n) for n in args.nodes.split(",")]
    found: dict[tuple[int, str], list[dict[str, float]]] = {}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="shoal-rdzv-") as tmp:
        for r in range(args.repeat):
            for n in counts:
                names = {f"n{j}": f"n{j}" for j in range(n)}
                with pod_network([PodSpec(f"n{i}", resolves=names) for i in range(n)], tag=f"t{n}") as net:
                    pods = list(net)
                    order = [("nodes", pods), ("one node", pods[:1])]
                    for kind, chosen in order if r % 2 == 0 else order[::-1]:
                        got = one_run(chosen, n, Path(tmp) / f"r{r}-n{n}-{kind.replace(' ', '')}")
                        found.setdefault((n, kind), []).append(got)
                        print(f"round {r + 1}: {n} {kind}: {got}", file=sys.stderr, flush=True)
    print(f"load average {load:.1f} -> {os.getloadavg()[0]:.1f}, median of {args.repeat} round(s)\n")
    print(
        "| nodes x processes | start -> rendezvous | rendezvous -> first step | same processes on one node: rendezvous -> first step | ratio |"
    )
    print("| --- | --- | --- | --- | --- |")
    for n in counts:
        multi = {
            k: statistics.median(run[k] for run in found[(n, "nodes")]) for k in ("rendezvous_s", "to_first_step_s")
        }
        single = statistics.median(run["to_first_step_s"] for run in found[(n, "one node")])
        print(
            f"| {n} x 1 | {multi['rendezvous_s']:.1f} s | {multi['to_first_step_s']:.1f} s | {single:.1f} s "
            f"| {multi['to_first_step_s'] / single:.2f} |"
        )


if __name__ == "__main__":
    main()
