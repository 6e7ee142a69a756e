"""The figures of docs/FAULT_TOLERANCE.md, measured in one run against a baseline of the same run.

    python tests/train/ft/bench_ft.py [--workload digits] [--epochs 3] [--kills 3] [--train-args="--arch resnet18 ..."]
    python tests/train/ft/bench_ft.py --epochs 40 --kills 3 --train-args="--start-method spawn"   # spawned groups
    python tests/train/ft/bench_ft.py --chaos [--groups 4] [--chaos-kills 10] [--kill-every 20] [--epochs 30]

1. Steady state: ``shoal train W --nproc 2`` (plain DDP, gloo) and ``shoal train W
   --fault-tolerance --nproc 2`` (2 replica groups of one process, torchft): the median
   time of a step (epoch time / steps; the last epochs, the first one holds the start-up).
   ``--nproc 4 --nproc-per-group 2 --train-args="--strategy fsdp"``: plain FSDP over 4 processes
   against HSDP, 2 replica groups of 2.
2. Faults: ``--kills`` runs of ``--fault-tolerance`` where replica group 1 is SIGKILLed right after
   its first commit: the survivor's next commit after the kill, and the restarted group's first
   commit after its process started (both from RUN_DIR/replicas.jsonl). ``--nodes``: each group
   on a node of its own (two network namespaces on a veth link; needs root).

3. ``--chaos`` (instead of 1 and 2): ``--groups`` replica groups trained twice with the same seed,
   once unfailed, once with a random live group SIGKILLed every ``--kill-every`` seconds (give or
   take a third), ``--chaos-kills`` times, each restarted by shoal: whether the run finished, whether
   any group restarted more often than it was killed (a survivor restarted), whether every group
   ended on the same weights, and the test accuracy of both runs.

Prints one JSON document. Not a test: the figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
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


def steady_state(workload: str, epochs: int, root: Path, extra: tuple[str, ...] = (), nproc: int = 2,
                 per_group: int = 1) -> dict:  # fmt: skip
    """The same job (``nproc`` processes, ``extra`` flags) without and with ``--fault-tolerance``, in
    groups of ``per_group`` processes."""
    plain, ft = root / "ddp", root / "ft"
    common = (workload, "--nproc", str(nproc), "--epochs", str(epochs), "--seed", "0", *extra)
    subprocess.run(_shoal(*common, "--out", str(plain)), check=True, capture_output=True)
    grouped = ("--fault-tolerance", "--nproc-per-group", str(per_group))
    subprocess.run(_shoal(*common, *grouped, "--out", str(ft)), check=True, capture_output=True)
    ddp_s, ft_s = _step_s(plain, None), _step_s(ft, "steps_committed")
    return {"ddp_step_s": ddp_s, "ft_step_s": ft_s, "ratio": ft_s / ddp_s}


def one_fault(workload: str, epochs: int, out: Path, extra: tuple[str, ...] = ()) -> dict:
    proc = subprocess.Popen(
        _shoal(workload, "--nproc", "2", "--epochs", str(epochs), "--fault-tolerance", *extra, "--out", str(out)),
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
    return _fault_figures(events(out), victim, killed_at)


def one_fault_across_nodes(workload: str, epochs: int, out: Path) -> dict:
    """:func:`one_fault` with each group on a node of its own: two network namespaces on a veth
    link (tests/cluster/netns.py), node 0 serving the lighthouse; group 1 (node 1) is SIGKILLed
    and restarted by node 1's launcher, healing from node 0 across the link."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the namespaced nodes' helpers
    from cluster.helpers import shoal_on, wait_all
    from cluster.netns import node_pair

    out.mkdir(parents=True)
    with node_pair() as (a, b):
        job = ["--nnodes", "2", "--master-addr", a.addr, "--nproc", "1", "--epochs", str(epochs), "--device", "cpu"]
        launched = [
            shoal_on(
                node,
                ["train", workload, "--fault-tolerance", *job, "--node-rank", str(rank), "--out", str(out / "run")],
                out / f"node{rank}.log",
                cwd=out,
            )
            for rank, node in enumerate((a, b))
        ]
        while not all(find(events(out / "run"), g, "joined") for g in (0, 1)):
            if any(item.proc.poll() is not None for item in launched):
                raise RuntimeError("a node's launcher ended early: " + " | ".join(i.output[-500:] for i in launched))
            time.sleep(0.02)
        victim = find(events(out / "run"), 1, "start")[0]["pid"]
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        wait_all(launched, 600)
    return _fault_figures(events(out / "run"), victim, killed_at)


def _fault_figures(found: list[dict], victim: int, killed_at: float) -> dict:
    """From the run's events: the survivor's next commit after the kill, the returning group's first."""
    alone = next(e for e in find(found, 0, "quorum") if e["t"] > killed_at)
    second = [e for e in find(found, 1, "joined") if e["pid"] != victim]
    finished = {e["group"]: e["params"] for e in found if e["event"] == "finished"}
    return {
        "survivor_next_commit_s": alone["t"] - killed_at,
        "survivor_dropped_steps": len(find(found, 0, "dropped")),
        "returning_first_commit_s": second[0]["after_s"],
        "weights_equal": finished.get(0) == finished.get(1),
    }


def _final_accuracy(out: Path) -> float:
    return metrics(out)[-1]["test_accuracy"]


def chaos(workload: str, epochs: int, groups: int, kills: int, every_s: float, root: Path) -> dict:
    """An unfailed run and a chaos run of ``groups`` replica groups, the same seed (see the module docstring)."""
    common = [workload, "--nproc", str(groups), "--epochs", str(epochs), "--seed", "0", "--fault-tolerance"]
    base, run = root / "unfailed", root / "chaos"
    subprocess.run(_shoal(*common, "--out", str(base)), check=True, capture_output=True)
    chance = random.Random(0)
    log = root / "chaos.log"
    started = time.monotonic()
    with open(log, "w") as sink:
        proc = subprocess.Popen(_shoal(*common, "--out", str(run)), stdout=sink, stderr=subprocess.STDOUT)
    killed: dict[int, int] = {}
    try:
        while not all(find(events(run), g, "joined") for g in range(groups)):
            if proc.poll() is not None:
                raise RuntimeError(f"the chaos run ended before every group committed ({proc.returncode})")
            time.sleep(0.1)
        while len(killed) < kills and sum(killed.values()) < kills and proc.poll() is None:
            time.sleep(every_s * chance.uniform(2 / 3, 4 / 3))
            found = events(run)
            if proc.poll() is not None or any(e["event"] == "finished" for e in found):
                break
            live = {g: find(found, g, "start")[-1]["pid"] for g in range(groups) if find(found, g, "start")}
            group = chance.choice(sorted(live))
            try:
                os.kill(live[group], signal.SIGKILL)
            except ProcessLookupError:  # it ended between the read and the kill: pick again next time
                continue
            killed[group] = killed.get(group, 0) + 1
        proc.wait(timeout=3600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wall_s = time.monotonic() - started
    found = events(run)
    starts = {g: len(find(found, g, "start")) for g in range(groups)}
    finished = {e["group"]: e["params"] for e in found if e["event"] == "finished"}
    return {
        "exit_status": proc.returncode,
        "wall_s": round(wall_s, 1),
        "kills": sum(killed.values()),
        "kills_per_group": killed,
        "starts_per_group": starts,
        "a_survivor_restarted": any(starts[g] != 1 + killed.get(g, 0) for g in range(groups)),
        "weights_equal": len(finished) == groups and len(set(finished.values())) == 1,
        "accuracy_unfailed": _final_accuracy(base),
        "accuracy_chaos": _final_accuracy(run) if proc.returncode == 0 else None,
        "steps_dropped": sum(1 for e in found if e["event"] == "dropped"),
        "log_tail": log.read_text()[-2000:] if proc.returncode != 0 else "",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="digits")
    parser.add_argument("--nproc", type=int, default=2, help="steady state: processes of both jobs")
    parser.add_argument("--nproc-per-group", type=int, default=1, help="steady state: processes per replica group")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument(
        "--train-args",
        default="",
        help='more shoal train flags (steady state, and faults on one node): --train-args="--arch resnet18"',
    )
    parser.add_argument("--nodes", action="store_true", help="the faults on two namespaced nodes, one group each")
    parser.add_argument("--chaos", action="store_true", help="the chaos run instead (see the module docstring)")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--chaos-kills", type=int, default=10)
    parser.add_argument("--kill-every", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="shoal-ft-bench-") as tmp:
        root = Path(tmp)
        if args.chaos:
            report = chaos(args.workload, args.epochs, args.groups, args.chaos_kills, args.kill_every, root)
            print(json.dumps(report, indent=2))
            return
        report = {
            "steady_state": steady_state(
                args.workload, args.epochs, root, tuple(shlex.split(args.train_args)), args.nproc, args.nproc_per_group
            )
        }
        if args.kills == 0:
            print(json.dumps(report, indent=2))
            return
        extra = tuple(shlex.split(args.train_args))
        if args.nodes:
            report["faults"] = [
                one_fault_across_nodes(args.workload, args.epochs, root / f"kill-{i}") for i in range(args.kills)
            ]
        else:
            report["faults"] = [
                one_fault(args.workload, args.epochs, root / f"kill-{i}", extra) for i in range(args.kills)
            ]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
