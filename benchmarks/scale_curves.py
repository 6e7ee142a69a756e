"""How each cost of a job grows with its nodes, against torch's own baseline in the same run
(docs/BENCHMARKS.md, "Cost curves to 16 nodes").

    sudo .venv/bin/python benchmarks/scale_curves.py --nodes 1,2,4,8,16,4x2 --repeat 2 \\
        --json curves.json --plot docs/scale_curves.png

Every size ``N`` (or ``NxP``: N nodes of P processes) is N pods on one bridge (tests/cluster/pods.py:
network namespaces with their own names and host name, addresses 10.79.<s>.2 and up, removed at
the end), one launcher per pod, all started at once. Each measurement is a pair (or more) of arms
run back to back on the same pods, their order alternating round by round:

- ``startup``: seconds from starting the launchers to the last rank's first training step
  (benchmarks/startup_probe.py: a gloo group, one DDP step with its all-reduce and optimizer step,
  then each rank stamps the time), for ``shoal run`` with the static and the c10d rendezvous and
  ``torchrun`` with the same two (node 0 hosting the store; torchrun given what it needs between
  namespaces: GLOO_SOCKET_IFNAME, and for c10d ``--local-addr`` and ``is_host``), and the same
  processes on one node (``shoal run --nproc N*P``); each launch's phases too (when the last
  launcher finished its imports, the last worker started, imported torch, had its process group
  and its first step: the probe's stamps), printed as a second table;
- ``step``: median ms per step of a tiny MLP (benchmarks/scale_probe.py), shoal's trainer against a
  hand-written DDP loop, both under ``shoal run`` (static): weak scaling, 100 steps per rank per epoch, one thread per process (OMP_NUM_THREADS=1);
- ``elastic``: tests/cluster/elastic_timing.py's job on N nodes (``--nnodes N-1:N``, ``shoal train
  digits``), one node's launcher SIGKILLed after epoch 4: seconds until a restarted worker resumed
  from its checkpoint, shoal's rendezvous settings against torch's defaults;
- ``hang``: ``shoal run --hang-timeout 10`` of tests/launch/scripts/hang_faults.py on N nodes, the
  last rank stopping at step 30: seconds from its stop to the report naming it with every rank's
  stack; and the same script without a fault against a copy that does not report its progress
  (``progress=False``): what the watchdog's records cost per step;
- ``status``: ``shoal status`` and ``shoal doctor --nnodes`` on every node of a live N-node job:
  seconds, and the first lines they print.

``--json`` writes every round's figures; ``--plot`` draws the start-up and step-time curves as
ratios to their baselines (matplotlib).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # cluster.pods, cluster.helpers, warm

from cluster import pods as podlib
from cluster.helpers import clean_env

ROOT = Path(__file__).resolve().parents[1]
os.environ["SHOAL_TEST_FRESH"] = "1"  # every launcher a fresh interpreter, as a user starts it

podlib.SUBNET_PREFIX = "10.79"  # apart from the tests' 10.77 and 10.78

PY = sys.executable
PROBE = str(ROOT / "benchmarks" / "startup_probe.py")
STEP_PROBE = str(ROOT / "benchmarks" / "scale_probe.py")
HANG_SCRIPT = str(ROOT / "tests" / "launch" / "scripts" / "hang_faults.py")
STEPS = 100
TIMEOUT_S = 900
JOIN_S = "300"
"""Every launcher's join timeout: 16 launchers importing torch on 2 cores need more than 60 s."""


def _size(label: str) -> tuple[int, int]:
    nodes, _, procs = label.partition("x")
    return int(nodes), int(procs or 1)


def _startup_cmd(arm: str, i: int, n: int, p: int, pod, port: int) -> tuple[list[str], dict[str, str]]:
    """The launcher of node ``i`` for ``arm``, and its environment."""
    env = clean_env()
    if arm == "shoal one node":
        cmd = [PY, "-m", "shoal", "run", "--nproc", str(n * p)]
    elif arm == "shoal static":
        cmd = [PY, "-m", "shoal", "run", "--nnodes", str(n), "--node-rank", str(i), "--master-addr", "n0",
               "--master-port", str(port), "--nproc", str(p), "--join-timeout", JOIN_S]  # fmt: skip
    elif arm == "shoal c10d":
        cmd = [PY, "-m", "shoal", "run", "--nnodes", str(n), "--nproc", str(p), "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"n0:{port}", "--rdzv-id", "curve", "--join-timeout", JOIN_S]  # fmt: skip
    elif arm == "torchrun static":
        cmd = [PY, "-m", "torch.distributed.run", "--nnodes", str(n), "--node-rank", str(i), "--master-addr", "n0",
               "--master-port", str(port), "--nproc-per-node", str(p)]  # fmt: skip
        env["GLOO_SOCKET_IFNAME"] = pod.ifname
    elif arm == "torchrun c10d":
        cmd = [PY, "-m", "torch.distributed.run", "--nnodes", str(n), "--nproc-per-node", str(p),
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"n0:{port}", "--rdzv-id", "curve",
               "--local-addr", pod.addr, "--rdzv-conf", f"is_host={int(i == 0)},join_timeout={JOIN_S}"]  # fmt: skip
        env["GLOO_SOCKET_IFNAME"] = pod.ifname
    else:
        raise ValueError(arm)
    return cmd, env


def _launch(pods, cmds: list[tuple[list[str], dict[str, str]]], work: Path) -> tuple[list, list[Path]]:
    procs, logs = [], []
    for pod, (cmd, env) in zip(pods, cmds):
        log = work / f"{pod.name}.log"
        with open(log, "w") as sink:
            procs.append(pod.popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=str(work)))
        logs.append(log)
    return procs, logs


def _wait(procs, logs, timeout: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs):
        if time.monotonic() > deadline:
            _kill(procs)
            raise RuntimeError("timed out:\n" + _tails(logs))
        time.sleep(0.05)
    if any(p.returncode for p in procs):
        raise RuntimeError(f"exit {[p.returncode for p in procs]}:\n" + _tails(logs))


def _kill(procs) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _tails(logs) -> str:
    return "\n".join(f"== {log.name}\n{log.read_text(errors='replace')[-1500:]}" for log in logs)


def startup(pods, label: str, arm: str, work: Path, port: int) -> float:
    """Seconds from starting every node's launcher to the last rank's first step."""
    n, p = _size(label)
    stamps = work / "stamps"
    stamps.mkdir(parents=True)
    cmds = []
    for i, pod in enumerate(pods[:1] if arm == "shoal one node" else pods):
        cmd, env = _startup_cmd(arm, i, n, p, pod, port)
        # python -m MODULE ... run by the probe, which stamps when the launcher's imports are done
        cmd = [PY, PROBE, "--launcher", str(stamps), pod.name, *cmd[2:]]
        cmds.append(([*cmd, PROBE, str(stamps)], env))
    start = time.time()
    procs, logs = _launch(pods, cmds, work)
    _wait(procs, logs)
    found = [float(f.read_text()) for f in stamps.glob("rank*.txt")]
    if len(found) != n * p:
        raise RuntimeError(f"{len(found)} of {n * p} ranks stamped:\n" + _tails(logs))
    PHASES.setdefault(label, {}).setdefault(arm, []).append(_phases(stamps, start))
    return max(found) - start


PHASES: dict[str, dict[str, list[dict[str, float]]]] = {}
"""Where each start-up went (:func:`_phases`, by size and arm), for --json."""
PHASE_NAMES = {
    "launchers imported": "the last launcher done importing (its modules: torch's agent, shoal's launch)",
    "workers started": "the last worker process started (rendezvous closed, workers spawned)",
    "workers imported": "the last worker done importing torch",
    "group ready": "the last rank's init_process_group returned",
    "first step": "the last rank's first step done",
}


def _phases(stamps: Path, start: float) -> dict[str, float]:
    """Seconds from starting the launchers to the last launcher / worker reaching each phase, and the
    median (over nodes / ranks) of each phase's own length: benchmarks/startup_probe.py's stamps."""
    launched = [float(f.read_text()) for f in stamps.glob("launcher-*.txt")]
    ranks = [json.loads(f.read_text()) for f in stamps.glob("phases-*.json")]
    by_host = collections.defaultdict(list)
    for rank in ranks:
        by_host[rank["host"]].append(rank)
    launcher_at = {f.name[len("launcher-") : -len(".txt")]: float(f.read_text()) for f in stamps.glob("launcher-*.txt")}
    spawn = [min(r["started"] for r in rs) - launcher_at[h] for h, rs in by_host.items() if h in launcher_at]
    out = {
        "launchers imported": max(launched) - start,
        "workers started": max(r["started"] for r in ranks) - start,
        "workers imported": max(r["imported"] for r in ranks) - start,
        "group ready": max(r["grouped"] for r in ranks) - start,
        "first step": max(r["stepped"] for r in ranks) - start,
        # each one's own length, median over nodes / ranks
        "launcher import (median)": statistics.median(launched) - start,
        "launcher imported -> its first worker started (median)": statistics.median(spawn) if spawn else math.nan,
        "worker import (median)": statistics.median(r["imported"] - r["started"] for r in ranks),
        "last worker imported -> group ready": max(r["grouped"] for r in ranks) - max(r["imported"] for r in ranks),
        "group ready -> first step": max(r["stepped"] for r in ranks) - max(r["grouped"] for r in ranks),
    }
    return out


def step(pods, label: str, variant: str, work: Path, port: int) -> float:
    """Median ms per step of the tiny MLP, ``variant`` plain or shoal, under ``shoal run`` (static)."""
    n, p = _size(label)
    work.mkdir(parents=True)
    cmds = []
    for i, pod in enumerate(pods):
        cmd, env = _startup_cmd("shoal static", i, n, p, pod, port)
        env["OMP_NUM_THREADS"] = "1"  # as the plain loop's torch.set_num_threads(1)
        cmds.append(([*cmd, STEP_PROBE, variant, str(work), str(STEPS)], env))
    procs, logs = _launch(pods, cmds, work)
    _wait(procs, logs)
    return json.loads((work / f"{variant}.json").read_text())["step_ms"]


def records(pods, label: str, arm: str, work: Path, port: int) -> dict[str, float]:
    """us per step of a digits-size DDP step without and with the watchdog's progress records
    (benchmarks/scale_probe.py ``records``: alternating blocks of 50 steps, one launch)."""
    n, p = _size(label)
    work.mkdir(parents=True)
    cmds = []
    for i, pod in enumerate(pods):
        cmd, env = _startup_cmd("shoal static", i, n, p, pod, port)
        cmds.append(([*cmd, STEP_PROBE, "records", str(work), "50"], env))
    procs, logs = _launch(pods, cmds, work)
    _wait(procs, logs)
    return json.loads((work / "records.json").read_text())


TORCH_RDZV_DEFAULTS = "keep_alive_interval=5,keep_alive_max_attempt=3,last_call_timeout=30"
"""torch's DynamicRendezvousHandler defaults (heartbeat 5 s, gone after 3 misses, last call 30 s)."""
SHOWN: dict[str, str] = {}
"""What ``shoal status`` and ``shoal doctor`` printed (the last run of each), for --json."""


def _epochs(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]


def _stop(pods, procs) -> None:
    """End what runs in the pods (the pods themselves stay for the next arm)."""
    for pod in pods:
        pod.kill_processes()
    for proc in procs:
        proc.wait()


LOSS_MARKS = {
    "a survivor's worker failed": ("Connection closed by peer", "Connection reset by peer", "Traceback"),
    "re-rendezvous done": ("the job goes on with",),
    "resumed": ("resuming from",),
}
"""What a survivor's log shows after the kill, first seen (polling every 50 ms), for :func:`elastic`."""
LOSS_TIMES: dict[str, dict[str, list[dict[str, float]]]] = {}
"""Seconds from the kill to each of :data:`LOSS_MARKS`, by size and arm, for --json."""


def elastic(pods, label: str, arm: str, work: Path, port: int) -> float:
    """tests/cluster/elastic_timing.py's measurement on N nodes: seconds from SIGKILLing the last node's
    processes (after epoch 4 on all N) until a survivor's restarted worker resumed from its checkpoint."""
    n, p = _size(label)
    out = work / "run"
    work.mkdir(parents=True)
    conf = [] if arm == "shoal" else ["--rdzv-conf", TORCH_RDZV_DEFAULTS]
    cmds = []
    for _ in pods:
        cmd = [PY, "-m", "shoal", "run", "--nnodes", f"{n - 1}:{n}", "--nproc-per-node", str(p),
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{pods[0].addr}:{port}", "--rdzv-id", "curve",
               "--max-restarts", "3", "--join-timeout", "600", *conf, "-m", "shoal", "train", "digits",
               "--device", "cpu", "--epochs", "12", "--out", str(out)]  # fmt: skip
        cmds.append((cmd, clean_env()))
    procs, logs = _launch(pods, cmds, work)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not (len(_epochs(out)) >= 4 and _epochs(out)[-1]["world_size"] == n * p):
            if time.monotonic() > deadline or any(proc.poll() is not None for proc in procs):
                raise RuntimeError(f"no epoch 4 on {n} nodes:\n" + _tails(logs))
            time.sleep(0.05)
        survivors = logs[:-1]
        before = {log: len(log.read_text(errors="replace")) for log in survivors}
        kill = time.monotonic()
        pods[-1].kill_processes()  # the node is lost: its launcher and its workers
        marks: dict[str, float] = {}
        while True:
            if time.monotonic() - kill > TIMEOUT_S or all(proc.poll() is not None for proc in procs[:-1]):
                raise RuntimeError("no resume after the kill:\n" + _tails(logs))
            since = [log.read_text(errors="replace")[before[log] :] for log in survivors]
            for mark, needles in LOSS_MARKS.items():
                if mark not in marks and any(needle in text for needle in needles for text in since):
                    marks[mark] = round(time.monotonic() - kill, 1)
            if "resumed" in marks:
                LOSS_TIMES.setdefault(label, {}).setdefault(arm, []).append(marks)
                return marks["resumed"]
            time.sleep(0.05)
    finally:
        _stop(pods, procs)


def hang(pods, label: str, arm: str, work: Path, port: int) -> float:
    """Seconds from the last rank blocking (step 30 of tests/launch/scripts/hang_faults.py) until node 0's
    report names it and every rank's stack is saved (each node saves its own ranks'), with the default
    hang timeout (``arm`` "default") or ``--hang-timeout 10``."""
    n, p = _size(label)
    work.mkdir(parents=True)
    mark = work / "hang-started"
    timeout = [] if arm == "default" else ["--hang-timeout", "10"]
    cmds = []
    for i, pod in enumerate(pods):
        cmd, _ = _startup_cmd("shoal static", i, n, p, pod, port)
        out = work / f"out{i}"
        out.mkdir()
        env = clean_env(FAULT="block", FAULT_RANK=str(n * p - 1), FAULT_STEP="30", STEPS="100000",
                        HANG_MARK=str(mark), OUT=str(out))  # fmt: skip
        cmd = [*cmd, "--log-dir", str(work / f"run{i}"), *timeout, "--on-hang", "stop", HANG_SCRIPT]
        cmds.append((cmd, env))
    procs, logs = _launch(pods, cmds, work)
    named = re.compile(rf"^rank {n * p - 1} \(node \S+\) is in ", re.M)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            if time.monotonic() > deadline or procs[0].poll() is not None and not named.search(logs[0].read_text()):
                raise RuntimeError("no hang report:\n" + _tails(logs))
            stacks = list(work.glob("run*/hang-*/rank-*.txt"))
            if mark.exists() and named.search(logs[0].read_text(errors="replace")) and len(stacks) == n * p:
                return time.time() - float(mark.read_text())
            time.sleep(0.05)
    finally:
        _stop(pods, procs)


def status(pods, label: str, arm: str, work: Path, port: int) -> float:
    """Seconds ``shoal status --stacks`` (on the last node, about a live job of tests/launch/scripts/
    hang_faults.py on every node) or ``shoal doctor --nnodes N`` (on every node at once) takes."""
    n, p = _size(label)
    work.mkdir(parents=True)
    cmds = []
    if arm == "doctor":
        for i, _pod in enumerate(pods):
            cmds.append(([PY, "-m", "shoal", "doctor", "--nnodes", str(n), "--node-rank", str(i), "--master-addr",
                          "n0", "--master-port", str(port), "--join-timeout", "600", "--checkpoint-dir",
                          str(work / "ckpt")], clean_env()))  # fmt: skip
        start = time.monotonic()
        procs, logs = _launch(pods, cmds, work)
        try:
            deadline = time.monotonic() + TIMEOUT_S
            while any(proc.poll() is None for proc in procs) and time.monotonic() < deadline:
                time.sleep(0.05)
            took = time.monotonic() - start
            SHOWN[f"doctor {label}"] = logs[0].read_text(errors="replace")
            if procs[0].returncode is None:
                raise RuntimeError("doctor did not finish:\n" + _tails(logs))
            return took
        finally:
            _stop(pods, procs)
    for i, pod in enumerate(pods):
        cmd, _ = _startup_cmd("shoal static", i, n, p, pod, port)
        env = clean_env(FAULT="none", STEPS="1000000", STEP_S="0.05")
        cmds.append(([*cmd, "--log-dir", str(work / f"run{i}"), HANG_SCRIPT], env))
    procs, logs = _launch(pods, cmds, work)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while len(list(work.glob("run*/progress/rank-*.progress"))) < n * p:
            if time.monotonic() > deadline or any(proc.poll() is not None for proc in procs):
                raise RuntimeError("the job did not start:\n" + _tails(logs))
            time.sleep(0.1)
        time.sleep(10)  # every rank steps
        start = time.monotonic()
        cmd = [PY, "-m", "shoal", "status", str(work / f"run{n - 1}"), "--stacks"]
        shown = pods[-1].run(cmd, capture_output=True, text=True, env=clean_env(), timeout=300)
        took = time.monotonic() - start
        SHOWN[f"status {label}"] = shown.stdout + shown.stderr
        if shown.returncode != 0:
            raise RuntimeError(f"shoal status failed: {shown.stdout}{shown.stderr}")
        return took
    finally:
        _stop(pods, procs)


MEASURES = {
    "startup": (startup, ("shoal static", "shoal one node", "torchrun static", "shoal c10d", "torchrun c10d")),
    "step": (step, ("plain", "shoal")),
    "records": (records, ("blocks",)),
    "elastic": (elastic, ("shoal", "torch defaults")),
    "hang": (hang, ("default",)),
    "status": (status, ("status", "doctor")),
}


def _pods(label: str, tag: str):
    n, _ = _size(label)
    names = {f"n{j}": f"n{j}" for j in range(n)}
    return podlib.pod_network([podlib.PodSpec(f"n{i}", resolves=names) for i in range(n)], tag=tag)


def _uptime() -> str:
    """The time, the load averages and the CPU pressure stall (the share of time some task waited for a CPU)."""
    up = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    try:
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return up
    return f"{up}; cpu pressure: {' '.join(some.split()[:3])}"


def run_curves(labels: list[str], measures: list[str], repeat: int, tmp: Path, log, save, skip=()) -> dict:
    found: dict = {m: {label: {} for label in labels} for m in measures}
    port = 29800
    for r in range(repeat):
        for label in labels:
            with _pods(label, f"c{r}{label.replace('x', 'p')}") as net:
                pods = list(net)
                for measure in measures:
                    fn, arms = MEASURES[measure]
                    order = list(arms) if r % 2 == 0 else list(arms)[::-1]
                    for arm in order:
                        if arm in skip:
                            continue
                        port += 1
                        work = tmp / f"r{r}-{label}-{measure}-{arm.replace(' ', '_')}"
                        try:
                            value = fn(pods, label, arm, work, port)
                        except RuntimeError as failed:  # recorded, and the run goes on
                            SHOWN[f"failed: {label} {measure} {arm}"] = str(failed)[-6000:]
                            log(f"round {r + 1} {label} {measure} {arm}: FAILED {str(failed)[:300]}  [{_uptime()}]")
                            _stop(pods, [])
                            save(found)
                            continue
                        found[measure][label].setdefault(arm, []).append(value)
                        shown = json.dumps(value) if isinstance(value, dict) else f"{value:.2f}"
                        log(f"round {r + 1} {label} {measure} {arm}: {shown}  [{_uptime()}]")
                        save(found)
    return found


def table(found: dict) -> str:
    lines = []
    if "startup" in found:
        lines += [
            "| nodes x processes | shoal static | torchrun static | shoal c10d | torchrun c10d "
            "| same processes on one node (shoal) | static: shoal / torchrun | c10d: shoal / torchrun "
            "| shoal static / one node | shoal static / its 1 x 1 |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        rows = found["startup"]
        one = statistics.median(rows["1"]["shoal static"]) if "1" in rows else None
        for label, arms in rows.items():
            if not arms:
                continue
            m = collections.defaultdict(lambda: math.nan, {a: statistics.median(v) for a, v in arms.items()})
            n, p = _size(label)
            vs_one = f"{m['shoal static'] / one:.2f}" if one else "-"
            lines.append(
                f"| {n} x {p} | {m['shoal static']:.1f} s | {m['torchrun static']:.1f} s | {m['shoal c10d']:.1f} s "
                f"| {m['torchrun c10d']:.1f} s | {m['shoal one node']:.1f} s "
                f"| {m['shoal static'] / m['torchrun static']:.2f} | {m['shoal c10d'] / m['torchrun c10d']:.2f} "
                f"| {m['shoal static'] / m['shoal one node']:.2f} | {vs_one} |"
            )
        lines.append("")
    if "step" in found:
        lines += [
            "| nodes x processes | plain DDP ms/step | shoal trainer ms/step | ratio |",
            "| --- | --- | --- | --- |",
        ]
        for label, arms in found["step"].items():
            if not arms:
                continue
            m = collections.defaultdict(lambda: math.nan, {a: statistics.median(v) for a, v in arms.items()})
            n, p = _size(label)
            lines.append(f"| {n} x {p} | {m['plain']:.1f} | {m['shoal']:.1f} | {m['shoal'] / m['plain']:.2f} |")
        lines.append("")
    if "records" in found:
        lines += [
            "| nodes x processes | records off us/step | on us/step | on - off | ratio |",
            "| --- | --- | --- | --- | --- |",
        ]
        for label, arms in found["records"].items():
            if "blocks" not in arms:
                continue
            off = statistics.median(v["off"] for v in arms["blocks"])
            on = statistics.median(v["on"] for v in arms["blocks"])
            n, p = _size(label)
            lines.append(f"| {n} x {p} | {off:.0f} | {on:.0f} | {on - off:+.0f} | {on / off:.3f} |")
        lines.append("")
    for measure in ("elastic", "hang", "status"):
        if measure not in found:
            continue
        arms = [a for a in MEASURES[measure][1] if any(a in got for got in found[measure].values())]
        lines += [f"| {measure}: nodes x processes | " + " | ".join(arms) + " |", "| --- |" + " --- |" * len(arms)]
        for label, got in found[measure].items():
            if not got:
                continue
            n, p = _size(label)
            cells = [
                f"{statistics.median(got[a]):.1f} s ({', '.join(f'{v:.1f}' for v in got[a])})" if a in got else "-"
                for a in arms
            ]
            lines.append(f"| {n} x {p} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def phase_table(phases: dict) -> str:
    """Where each start-up went: seconds from starting the launchers to the last one reaching each
    phase, then each phase's own length (see :func:`_phases`); one column per launch."""
    cols = [(label, arm, i) for label, arms in phases.items() for arm, got in arms.items() for i in range(len(got))]
    if not cols:
        return ""
    keys = list(phases[cols[0][0]][cols[0][1]][0])
    lines = ["| seconds | " + " | ".join(f"{label} {arm}" for label, arm, _ in cols) + " |",
             "| --- |" + " --- |" * len(cols)]  # fmt: skip
    for key in keys:
        cells = [phases[label][arm][i].get(key, math.nan) for label, arm, i in cols]
        lines.append(f"| {key} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    return "\n".join(lines) + "\n"


def plot(found: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [m for m in ("startup", "step") if m in found]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    for ax, measure in zip(axes[0], panels):
        single = [(label, arms) for label, arms in found[measure].items() if "x" not in label and arms]
        rows = dict(sorted(single, key=lambda row: int(row[0])))
        nodes = [int(label) for label in rows]
        for arm in MEASURES[measure][1]:
            have = [label for label in rows if rows[label].get(arm)]
            xs, ys = [int(label) for label in have], [statistics.median(rows[label][arm]) for label in have]
            ax.plot(xs, ys, marker="o", linestyle="--" if arm.startswith(("torchrun", "plain")) else "-", label=arm)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(nodes, [str(n) for n in nodes])
        ax.set_xlabel("nodes (1 process each)")
        ax.set_ylabel("seconds to the first step on every rank" if measure == "startup" else "ms per step (median)")
        ax.set_title("start-up" if measure == "startup" else "step time, tiny MLP")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def report(paths: list[str], png: str | None) -> None:
    """Print the tables of earlier runs (their --json files, merged: a later file's arms win) and plot them."""
    merged: dict = {}
    phases: dict = {}
    for path in paths:
        saved = json.loads(Path(path).read_text())
        print(f"{path}: uptime {saved['uptime'][0]} -> {saved['uptime'][1]}")
        for measure in MEASURES:
            for label, arms in saved.get(measure, {}).items():
                arms = {arm.replace(",", ""): values for arm, values in arms.items()}  # an older spelling
                merged.setdefault(measure, {}).setdefault(label, {}).update(arms)
        for key, text in saved.get("shown", {}).items():
            print(f"--- {key} ---\n{text}")
        for label, arms in saved.get("phases", {}).items():
            phases.setdefault(label, {}).update(arms)
    print()
    print(table(merged))
    print(phase_table(phases))
    if png:
        plot(merged, png)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="1,2,4,8,16,4x2", help="sizes: N (N nodes of 1 process) or NxP")
    parser.add_argument("--measure", default="startup,step", help=f"of {','.join(MEASURES)}")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--skip", default="", help="arms not to run (e.g. 'shoal c10d,torchrun c10d')")
    parser.add_argument("--json", help="write every round's figures here")
    parser.add_argument("--plot", help="draw the curves into this PNG")
    parser.add_argument(
        "--report", help="no run: the tables and --plot of these --json files (comma-separated), merged"
    )
    args = parser.parse_args()
    if args.report:
        report(args.report.split(","), args.plot)
        return
    labels = args.nodes.split(",")
    measures = args.measure.split(",")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run removes its pods too
    before = _uptime()

    def save(found: dict) -> None:  # after every measurement: an interrupted run keeps what it measured
        if args.json:
            done = {
                "uptime": [before, _uptime()],
                "repeat": args.repeat,
                **found,
                "shown": SHOWN,
                "phases": PHASES,
                "loss": LOSS_TIMES,
            }
            Path(args.json).write_text(json.dumps(done, indent=1))

    with tempfile.TemporaryDirectory(prefix="shoal-curves-") as tmp:
        log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
        found = run_curves(labels, measures, args.repeat, Path(tmp), log, save, args.skip.split(","))
    print(f"uptime before: {before}\nuptime after:  {_uptime()}\nmedians of {args.repeat} round(s)\n")
    print(table(found))
    print(phase_table(PHASES))
    print(json.dumps(LOSS_TIMES))
    save(found)
    if args.plot:
        plot(found, args.plot)


if __name__ == "__main__":
    main()
