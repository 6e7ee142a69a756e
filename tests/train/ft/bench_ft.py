"""The figures of docs/FAULT_TOLERANCE.md, measured in one run against a baseline of the same run.

    python tests/train/ft/bench_ft.py [--workload digits] [--epochs 3] [--kills 3] [--train-args="--arch resnet18 ..."]
    python tests/train/ft/bench_ft.py --kills 0 --rounds 5 [--against OTHER_CHECKOUT/src]   # the step's cost
    python tests/train/ft/bench_ft.py --epochs 40 --kills 3 --train-args="--start-method spawn"   # spawned groups
    python tests/train/ft/bench_ft.py --chaos [--groups 8] [--chaos-kills 10] [--kill-every 2] [--epochs 30]
    python tests/train/ft/bench_ft.py --chaos --groups 8 --chaos-nodes 4 [--nproc-per-group 2 --train-args="--strategy fsdp"]
    python tests/train/ft/bench_ft.py --lighthouse-kills 10 --groups 8 --epochs 60 --train-args="--batch-size 8"

1. Steady state: ``shoal train W --nproc 2`` (plain DDP, gloo) and ``shoal train W
   --fault-tolerance --nproc 2`` (2 replica groups of one process, torchft): the median
   time of a step (epoch time / steps; the last epochs, the first one holds the start-up).
   ``--nproc 4 --nproc-per-group 2 --train-args="--strategy fsdp"``: plain FSDP over 4 processes
   against HSDP, 2 replica groups of 2. ``--rounds R``: the jobs R times in turn, medians;
   ``--against DIR``: a third job each round, the fault-tolerant one with shoal imported from DIR
   (another checkout's ``src``), and each round's ratio of this tree's step to DIR's.
2. Faults: ``--kills`` runs of ``--fault-tolerance`` where replica group 1 is SIGKILLed right after
   its first commit: the survivor's next commit after the kill, and the restarted group's first
   commit after its process started (both from RUN_DIR/replicas.jsonl). ``--nodes``: each group
   on a node of its own (two network namespaces on a veth link; needs root).

3. ``--chaos`` (instead of 1 and 2): ``--groups`` replica groups (of ``--nproc-per-group``
   processes) trained twice with the same seed, once unfailed, once with a random group SIGKILLed
   ``--chaos-kills`` times, each ``--kill-every`` seconds (give or take a third) after the previous
   victim's new process committed; ``--chaos-nodes N``: the groups spread over N namespaced nodes on
   one bridge (tests/cluster/pods.py; needs root). Per kill: the survivors' next commit (the last
   survivor's first commit after the kill) and the victim's return (its new process's first commit,
   seconds after it started); their median and worst; whether the run finished, whether any group
   restarted more often than it was killed (a survivor restarted), whether every restart recorded
   where it healed, whether every group ended on the same weights, the test accuracy of both runs.

4. ``--lighthouse-kills K`` (instead): ``--groups`` groups of one process on one node, the
   lighthouse SIGKILLed K times, each ``--kill-every`` seconds after every group trained again; per
   kill, the seconds until every group has committed 3 more steps, the groups restarted, the steps
   dropped; whether every group ended on the same weights.

Prints one JSON document. Not a test: the figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import contextlib
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: procs, warm, the namespaced nodes

from ft_events import events, find, lighthouses, metrics


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
                 per_group: int = 1, rounds: int = 1, against: Path | None = None) -> dict:  # fmt: skip
    """The same job (``nproc`` processes, ``extra`` flags) without and with ``--fault-tolerance``, in
    groups of ``per_group`` processes, ``rounds`` times in turn; ``against``: a shoal source tree
    (its ``src``) whose fault-tolerant job runs in the same rounds, for a change's per-step cost."""
    common = (workload, "--nproc", str(nproc), "--epochs", str(epochs), "--seed", "0", *extra)
    grouped = ("--fault-tolerance", "--nproc-per-group", str(per_group))
    variants = {"ddp": ((), None), "ft": (grouped, None)}
    if against is not None:
        variants["ft_against"] = (grouped, against)
    steps: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(rounds):
        for name, (flags, tree) in variants.items():
            out = root / f"{name}-{round_}"
            env = {**os.environ, "PYTHONPATH": str(tree)} if tree is not None else None
            subprocess.run(_shoal(*common, *flags, "--out", str(out)), check=True, capture_output=True, env=env)
            steps[name].append(_step_s(out, "steps_committed" if flags else None))
    report: dict = {f"{name}_step_s": statistics.median(values) for name, values in steps.items()}
    report["ratio"] = report["ft_step_s"] / report["ddp_step_s"]
    if against is not None:
        report["ft_against_ratio"] = report["ft_against_step_s"] / report["ddp_step_s"]
        report["ft_per_round"] = [round(a / b, 3) for a, b in zip(steps["ft"], steps["ft_against"])]
    report["rounds"] = {name: [round(v * 1000, 2) for v in values] for name, values in steps.items()}
    return report


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


def chaos(
    workload: str, epochs: int, groups: int, kills: int, every_s: float, root: Path, *, nodes: int = 1,
    per_group: int = 1, extra: tuple[str, ...] = (),
) -> dict:  # fmt: skip
    """An unfailed run and a chaos run of ``groups`` replica groups of ``per_group`` processes on
    ``nodes`` nodes (network namespaces on one bridge when more than one), the same seed (see the
    module docstring). Each kill waits for the previous victim's new process to commit."""
    common = [
        workload,
        "--epochs",
        str(epochs),
        "--seed",
        "0",
        "--fault-tolerance",
        "--nproc-per-group",
        str(per_group),
        *extra,
    ]
    base, run = root / "unfailed", root / "chaos"
    with _nodes(nodes, root) as start:
        for proc in start(common, groups * per_group, base):
            proc.wait(timeout=3600)
        started = time.monotonic()
        procs = start(common, groups * per_group, run)
        try:
            per_kill = _kill_in_turn(run, groups, kills, every_s, procs)
            for proc in procs:
                proc.wait(timeout=3600)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    wall_s = time.monotonic() - started
    found = events(run)
    status = max((p.returncode for p in procs), key=abs)
    killed = [k["group"] for k in per_kill]
    starts = {g: len(find(found, g, "start")) for g in range(groups)}
    restarts = [e for e in found if e["event"] == "start" and e["starts"] > 1]
    unrecorded = [e for e in restarts if not any(h["event"] == "healed" and h["pid"] == e["pid"] for h in found)]
    finished = {e["group"]: e["params"] for e in found if e["event"] == "finished"}
    waits = [k["survivors_next_commit_s"] for k in per_kill if k["survivors_next_commit_s"] is not None]
    returns = [k["returned_first_commit_s"] for k in per_kill if k["returned_first_commit_s"] is not None]
    return {
        "groups": groups, "nodes": nodes, "processes_per_group": per_group,
        "exit_status": status,
        "wall_s": round(wall_s, 1),
        "kills": len(per_kill),
        "per_kill": per_kill,
        "survivors_next_commit_s": _spread(waits, len(per_kill)),
        "returned_first_commit_s": _spread(returns, len(per_kill)),
        "starts_per_group": starts,
        "a_survivor_restarted": any(starts[g] != 1 + killed.count(g) for g in range(groups)),
        "restarts_without_healed_event": len(unrecorded),
        "weights_equal": len(finished) == groups and len(set(finished.values())) == 1,
        "accuracy_unfailed": _final_accuracy(base),
        "accuracy_chaos": _final_accuracy(run) if status == 0 else None,
        "steps_dropped": sum(1 for e in found if e["event"] == "dropped"),
    }  # fmt: skip


def lighthouse_kills(
    workload: str, epochs: int, groups: int, kills: int, every_s: float, root: Path, extra: tuple[str, ...] = ()
) -> dict:
    """``groups`` replica groups on one node; the lighthouse SIGKILLed ``kills`` times, each
    ``every_s`` seconds (give or take a third) after every group trained again: per kill, the seconds
    until every group has committed 3 more steps (from their progress records: a lighthouse that
    forms the same quorum again writes no event), the groups restarted and the steps dropped."""
    from listening import descendants
    from shoal.progress import progress_path, read_one, run_progress_dir

    out = root / "lighthouse-kills"
    proc = subprocess.Popen(
        _shoal(workload, "--nproc", str(groups), "--epochs", str(epochs), "--fault-tolerance", *extra, "--out", str(out)),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def steps() -> dict[int, int]:
        records = {g: read_one(progress_path(run_progress_dir(out), g)) for g in range(groups)}
        return {g: r.step for g, r in records.items() if r is not None}

    chance, per_kill = random.Random(0), []
    try:
        deadline = time.monotonic() + 600
        while not all(find(events(out), g, "joined") for g in range(groups)):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the run ended or stalled before every group committed")
            time.sleep(0.05)
        for _ in range(kills):
            time.sleep(every_s * chance.uniform(2 / 3, 4 / 3))
            lighthouse = lighthouses(descendants(proc.pid))
            if proc.poll() is not None or not lighthouse:
                break
            before, killed_at = steps(), time.time()
            os.kill(lighthouse[0], signal.SIGKILL)
            back: dict[int, float] = {}
            while len(back) < groups and time.time() - killed_at < 120 and proc.poll() is None:
                now = steps()
                back.update({g: time.time() - killed_at for g in now if g not in back and now[g] >= before[g] + 3})
                time.sleep(0.01)
            after = [e for e in events(out) if e["t"] > killed_at]
            per_kill.append({
                "every_group_trains_again_s": round(max(back.values()), 3) if len(back) == groups else None,
                "groups_restarted": sorted(e["group"] for e in after if e["event"] == "start"),
                "steps_dropped": sum(1 for e in after if e["event"] == "dropped"),
            })  # fmt: skip
        proc.wait(timeout=3600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    found = events(out)
    finished = {e["group"]: e["params"] for e in found if e["event"] == "finished"}
    waits = [k["every_group_trains_again_s"] for k in per_kill if k["every_group_trains_again_s"] is not None]
    return {
        "groups": groups, "exit_status": proc.returncode, "kills": len(per_kill), "per_kill": per_kill,
        "every_group_trains_again_s": _spread(waits, len(per_kill)),
        "groups_restarted": sum(len(k["groups_restarted"]) for k in per_kill),
        "weights_equal": len(finished) == groups and len(set(finished.values())) == 1,
    }  # fmt: skip


def _spread(values: list[float], expected: int) -> dict:
    """Median and worst of ``values``; ``missing``: how many of ``expected`` never came."""
    return {
        "median": round(statistics.median(values), 3) if values else None,
        "worst": round(max(values), 3) if values else None,
        "missing": expected - len(values),
    }


def _kill_in_turn(run: Path, groups: int, kills: int, every_s: float, procs: list) -> list[dict]:
    """SIGKILL a random group ``kills`` times, each after the previous victim's new process committed:
    per kill, the survivors' next commit (the last of them) and the victim's return."""
    chance = random.Random(0)

    def wait(predicate, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs):
                return False
            if predicate(events(run)):
                return True
            time.sleep(0.02)
        return False

    if not wait(lambda found: all(find(found, g, "joined") for g in range(groups)), 600):
        raise RuntimeError("the chaos run ended or stalled before every group committed")
    per_kill = []
    for _ in range(kills):
        time.sleep(every_s * chance.uniform(2 / 3, 4 / 3))
        found = events(run)
        if any(e["event"] == "finished" for e in found):
            break
        group = chance.randrange(groups)
        victim = find(found, group, "start")[-1]["pid"]
        killed_at = time.time()
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            continue
        survivors = [g for g in range(groups) if g != group]

        freed = wait(lambda found, ss=survivors, t=killed_at: all(_next_commit(found, g, t) for g in ss), 120)
        back = wait(lambda found, g=group, v=victim: any(e["pid"] != v for e in find(found, g, "joined")[-1:]), 120)
        found = events(run)
        returned = [e for e in find(found, group, "joined") if e["pid"] != victim]
        per_kill.append({
            "group": group,
            "survivors_next_commit_s": round(max(_next_commit(found, g, killed_at) for g in survivors), 3) if freed else None,
            "returned_first_commit_s": returned[-1]["after_s"] if back and returned else None,
        })  # fmt: skip
    return per_kill


def _next_commit(found: list[dict], group: int, since: float) -> float | None:
    """Seconds from ``since`` to ``group``'s first commit after it (a new quorum, or the end of drops)."""
    after = [e["t"] for e in found if e["group"] == group and e["t"] > since and e["event"] in ("quorum", "recovered")]
    return min(after) - since if after else None


@contextlib.contextmanager
def _nodes(nodes: int, root: Path):
    """A function that starts one job (``shoal train`` with ``args``, ``nproc`` processes in all, on
    ``nodes`` nodes) and returns its launchers: one process here, or one per namespaced node."""
    if nodes == 1:
        yield lambda args, nproc, out: [
            subprocess.Popen(_shoal(*args, "--nproc", str(nproc), "--out", str(out)), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        ]  # fmt: skip
        return
    from cluster.helpers import clean_env
    from cluster.pods import PodSpec, pod_network

    with pod_network([PodSpec(f"n{i}") for i in range(nodes)], tag="ft") as net:
        pods = [net[f"n{i}"] for i in range(nodes)]

        def start(args: list[str], nproc: int, out: Path) -> list:
            job = ["--nnodes", str(nodes), "--master-addr", pods[0].addr, "--nproc", str(nproc // nodes)]
            return [
                pod.popen(_shoal(*args, *job, "--node-rank", str(rank), "--out", str(out)), env=clean_env(),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=root)
                for rank, pod in enumerate(pods)
            ]  # fmt: skip

        yield start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="digits")
    parser.add_argument("--nproc", type=int, default=2, help="steady state: processes of both jobs")
    parser.add_argument("--nproc-per-group", type=int, default=1, help="steady state: processes per replica group")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1, help="steady state: the jobs this many times in turn")
    parser.add_argument(
        "--against", type=Path, help="steady state: also the fault-tolerant job of this shoal checkout's src/"
    )
    parser.add_argument(
        "--train-args",
        default="",
        help='more shoal train flags (steady state, and faults on one node): --train-args="--arch resnet18"',
    )
    parser.add_argument("--nodes", action="store_true", help="the faults on two namespaced nodes, one group each")
    parser.add_argument("--chaos", action="store_true", help="the chaos run instead (see the module docstring)")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--chaos-kills", type=int, default=10)
    parser.add_argument(
        "--kill-every", type=float, default=2.0, help="seconds between a victim's return and the next kill"
    )
    parser.add_argument("--chaos-nodes", type=int, default=1, help="the chaos run's nodes (namespaced; needs root)")
    parser.add_argument(
        "--lighthouse-kills", type=int, default=0, help="instead: SIGKILL the lighthouse this many times (--groups)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="shoal-ft-bench-") as tmp:
        root = Path(tmp)
        if args.lighthouse_kills:
            report = lighthouse_kills(
                args.workload, args.epochs, args.groups, args.lighthouse_kills, args.kill_every, root,
                tuple(shlex.split(args.train_args)),
            )  # fmt: skip
            print(json.dumps(report, indent=2))
            return
        if args.chaos:
            report = chaos(
                args.workload, args.epochs, args.groups, args.chaos_kills, args.kill_every, root,
                nodes=args.chaos_nodes, per_group=args.nproc_per_group, extra=tuple(shlex.split(args.train_args)),
            )  # fmt: skip
            print(json.dumps(report, indent=2))
            return
        report = {
            "steady_state": steady_state(
                args.workload,
                args.epochs,
                root,
                tuple(shlex.split(args.train_args)),
                args.nproc,
                args.nproc_per_group,
                args.rounds,
                args.against,
            )  # fmt: skip
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
