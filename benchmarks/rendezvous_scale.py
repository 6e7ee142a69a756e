"""``python -m benchmarks.rendezvous_scale``: the rendezvous of N nodes, simulated up to 1,000 nodes.

No model, no collectives, no worker process: N lightweight nodes, each torch's own elastic agent
(``SimpleElasticAgent``, the base of what torchrun and ``shoal run`` start) running in a thread, with
its rendezvous handler, against one real ``TCPStore`` (:mod:`benchmarks.rendezvous_agents`). A host
process holds node 0, which serves the store as it does in a real job; ``--processes`` more
processes hold the other nodes, spread evenly. Every node joins (``next_rendezvous``), takes part in
the rank assignment, keeps its heartbeat and polls the rendezvous while its (absent) workers run
for ``--hold`` seconds, then passes the exit barrier and shuts the handler down.

Variants (``--variants``):

* ``shoal_c10d``: ``shoal run --nnodes N --rdzv-backend c10d``: shoal's handler (``shoal-c10d``) with
  the settings of its rendezvous plan (:func:`shoal.launch.rendezvous.plan.plan_rendezvous`);
* ``torch_c10d``: torch's dynamic handler over the c10d backend with torch's defaults (torchrun
  ``--rdzv-backend c10d``): the baseline;
* ``shoal_static``: ``shoal run --nnodes N --rdzv-backend static`` (node 0 serves the store and waits
  for every node; ranks fixed);
* ``torch_static``: torch's static handler (torchrun ``--rdzv-backend static``), the baseline of static.

Figures per (variant, N): **closed** (s), from the start signal to the last node's workers starting
(handler created, store connected, rendezvous closed, ranks assigned); store operations per node
(every request a node's store client sent, counted by a proxy of the client: join, steady state
per second, exit), with their bytes; the store's CPU (its server threads, read from ``/proc``) and
the host process's peak RSS; the nodes' own CPU per node (the agent processes' CPU over N). With
``--loss``, at the largest N and with ``--nnodes N-1:N``, one node is killed (its heartbeats stop,
it never leaves), the others' workers fail as they would in their next collective, and **recovery**
is the time from the kill to the last survivor's workers starting again.

What this proves and what it cannot: docs/BENCHMARKS.md, "Rendezvous at 1,000 simulated nodes".
"""

from __future__ import annotations

import json
import os
import queue
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoal.bench import report as rep
from shoal.bench.harness import Benchmark, Log, Measured
from shoal.bench.timing import load_average
from shoal.errors import ShoalError

ALL_VARIANTS = ("shoal_c10d", "torch_c10d", "shoal_static", "torch_static")
BASELINE = {"shoal_c10d": "torch_c10d", "shoal_static": "torch_static"}
ROOT = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")
READY_S = 120.0
"""Starting a process that imports torch, on a busy machine."""
CASE_S = 300.0
"""The most one phase of one case may take before the case is abandoned (a note, not fatal)."""


@dataclass(frozen=True)
class RendezvousScaleConfig:
    """What ``python -m benchmarks.rendezvous_scale`` measures."""

    nodes: tuple[int, ...] = (16, 64, 256, 1000)
    """Simulated node counts, comma-separated."""
    variants: tuple[str, ...] = ALL_VARIANTS
    """Comma-separated: shoal_c10d, torch_c10d, shoal_static, torch_static."""
    processes: int = 2
    """Processes holding the nodes (besides the host's, which holds node 0 and the store)."""
    hold: float = 10.0
    """Seconds of steady state (heartbeats, monitoring) measured between the rendezvous and the exit."""
    loss: bool = True
    """At the largest c10d N, the c10d variants: kill one node and time the re-rendezvous (--nnodes N-1:N)."""
    c10d_max: int = 256
    """The c10d variants stop at this many nodes: every node re-reads and rewrites the whole state while
    joining, O(N^2) unpickling that here runs on this machine's cores, not on N machines' (0: no limit)."""
    monitor_interval: float = 0.1
    """Seconds between an agent's looks at its workers and the rendezvous (torchrun's and shoal's: 0.1)."""
    join_timeout: float = 60.0
    """shoal's --join-timeout (its default: 60 s)."""
    conf: str = field(default="", metadata={"metavar": "K=V,..."})
    """--rdzv-conf for the shoal variants (e.g. keep_alive_interval=5), as ``shoal run`` takes it."""

    def __post_init__(self) -> None:
        unknown = [v for v in self.variants if v not in ALL_VARIANTS]
        if unknown or not self.variants:
            raise ShoalError(
                f"unknown rendezvous variant(s): {', '.join(unknown) or '(none given)'}",
                f"choose --variants from: {', '.join(ALL_VARIANTS)}",
            )
        if min(self.nodes, default=0) < 2 or self.processes < 1 or self.hold < 0:
            raise ShoalError("--nodes must be 2 or more each, --processes at least 1", "pass e.g. --nodes 16,64")


SMOKE = dict(nodes=(8,), variants=("shoal_c10d", "shoal_static"), processes=1, hold=1.0, loss=False)
"""``--smoke``: 8 nodes, shoal's two backends, one second of steady state."""


def _parse_conf(text: str) -> tuple[tuple[str, str], ...]:
    pairs = [item.split("=", 1) for item in text.split(",") if item.strip()]
    return tuple((k.strip(), v.strip()) for k, v in pairs)


# -- one simulated job ------------------------------------------------------------------------------


class _Job:
    """The host process and the agent processes of one simulated job, and their events."""

    def __init__(self, spec: dict[str, Any], nodes: int, processes: int, work: Path) -> None:
        self.events: queue.Queue = queue.Queue()
        self.procs: list[subprocess.Popen] = []
        self.holds: list[range] = []
        splits = [range(0, 1)]
        rest = list(range(1, nodes))
        per = -(-len(rest) // processes)
        splits += [range(rest[i], rest[min(i + per, len(rest)) - 1] + 1) for i in range(0, len(rest), per)]
        env = {k: v for k, v in os.environ.items() if k != "SHOAL_ENV"}
        env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        for index, held in enumerate(splits):
            child = {**spec, "first": held.start, "count": len(held)}
            err = open(work / f"proc{index}.err", "w")  # noqa: SIM115 (closed with the process)
            proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.rendezvous_agents", json.dumps(child)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT, env=env,
            )  # fmt: skip
            self.procs.append(proc)
            self.holds.append(held)
            threading.Thread(target=self._read, args=(index, proc), daemon=True).start()
        self.work = work

    def _read(self, index: int, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                self.events.put((index, json.loads(line)))
            except ValueError:
                pass
        self.events.put((index, {"event": "eof"}))

    def tell(self, word: str, only: int | None = None) -> None:
        for index, proc in enumerate(self.procs):
            if only is None or index == only:
                assert proc.stdin is not None
                proc.stdin.write(word + "\n")
                proc.stdin.flush()

    def wait_all(self, kind: str, timeout: float, accept=lambda e: True) -> dict[int, dict[str, Any]]:
        """The first event ``kind`` (that ``accept`` takes) from every process; ShoalError otherwise."""
        got: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout
        while len(got) < len(self.procs):
            try:
                index, event = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise ShoalError(
                    f"no '{kind}' from {len(self.procs) - len(got)} process(es) in {timeout:.0f} s", ""
                ) from None
            if index in got:  # a process that answered may end (eof after "done") or say more
                continue
            if event["event"] in ("error", "eof"):
                raise ShoalError(f"process {index}: {event.get('error') or self._stderr(index)}", "")
            if event["event"] == kind and accept(event):
                got[index] = event
        return got

    def _stderr(self, index: int) -> str:
        lines = [ln for ln in (self.work / f"proc{index}.err").read_text().splitlines() if ln.strip()]
        code = self.procs[index].poll()
        return f"exited ({code}): " + (lines[-1] if lines else "(no output)")

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far: the store's server threads (in the host), the host, the agent processes."""
        host = self.procs[0].pid
        store = 0
        for tid in _listdir(f"/proc/{host}/task"):
            if _read(f"/proc/{host}/task/{tid}/comm").startswith("pt_tcpstore"):
                store += _ticks(_read(f"/proc/{host}/task/{tid}/stat"))
        agents = sum(_ticks(_read(f"/proc/{p.pid}/stat")) for p in self.procs[1:])
        return {
            "store": store / CLK_TCK,
            "host": _ticks(_read(f"/proc/{host}/stat")) / CLK_TCK,
            "agents": agents / CLK_TCK,
        }

    def host_memory_mb(self) -> dict[str, float]:
        status = _read(f"/proc/{self.procs[0].pid}/status")
        values = {}
        for line in status.splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) / 1024
        return values

    def close(self) -> None:
        for proc in self.procs:
            try:
                if proc.stdin:
                    proc.stdin.close()
                proc.wait(timeout=10)
            except (subprocess.TimeoutExpired, OSError):
                proc.kill()  # our own child, by its handle
                proc.wait()


def _free_port() -> int:
    """A free port on 127.0.0.1 below Linux's ephemeral range (32768-60999): the store's host binds it
    seconds later, and meanwhile the thousand client connections of this machine's jobs take their
    own ports from that range (a port the OS picked there was taken in between, seen here)."""
    for _ in range(200):
        port = random.randrange(20000, 32000)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise ShoalError("no free port between 20000 and 32000 on 127.0.0.1", "is the machine out of ports?")


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _ticks(stat: str) -> int:
    """utime + stime of a /proc stat line (the fields after the command's closing parenthesis)."""
    fields = stat.rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12]) if len(fields) > 12 else 0


def _ops(counts: dict[str, int]) -> int:
    return sum(v for k, v in counts.items() if k not in ("bytes", "connect"))


def _minus(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) - b.get(k, 0) for k in set(a) | set(b)}


def run_case(variant: str, nodes: int, cfg: RendezvousScaleConfig, work: Path, *, loss: bool = False) -> dict[str, Any]:
    """One simulated job of ``nodes`` nodes; its figures (see the module's docstring)."""
    settings, backend = variant.split("_")
    nnodes = f"{nodes - 1}:{nodes}" if loss else str(nodes)
    spec = {
        "settings": settings, "backend": backend, "nnodes": nnodes, "port": _free_port(),
        "run_id": f"sim-{variant}-{nodes}", "join_timeout": cfg.join_timeout, "monitor_interval": cfg.monitor_interval,
        "max_restarts": 3, "conf": dict(_parse_conf(cfg.conf)) if settings == "shoal" else {}, "deadline": time.time() + 4 * CASE_S,
    }  # fmt: skip
    job = _Job(spec, nodes, cfg.processes, work)
    row: dict[str, Any] = {"variant": variant + (" loss" if loss else ""), "nodes": nodes, "nnodes": nnodes}
    try:
        job.wait_all("ready", READY_S)
        cpu0, go = job.cpu(), time.time()
        job.tell("go")
        closed = job.wait_all("closed", CASE_S, accept=lambda e: e["worlds"] == [nodes])
        cpu1 = job.cpu()
        row["closed_s"] = max(e["t"] for e in closed.values()) - go
        row["store_cpu_join_s"] = cpu1["store"] - cpu0["store"]
        row["agents_cpu_join_ms_per_node"] = 1000 * (cpu1["agents"] - cpu0["agents"]) / max(1, nodes - 1)
        time.sleep(1.0)  # every node's first heartbeat after the rendezvous
        job.tell("mark")
        mark0, cpu2, t2 = job.wait_all("marked", CASE_S), job.cpu(), time.monotonic()
        time.sleep(cfg.hold)
        job.tell("mark")
        mark1, cpu3, t3 = job.wait_all("marked", CASE_S), job.cpu(), time.monotonic()
        held = t3 - t2
        steady = _minus(_sum(mark1), _sum(mark0))
        row["steady_ops_per_node_s"] = _ops(steady) / nodes / held if held > 0 else float("nan")
        row["steady_kb_per_node_s"] = steady.get("bytes", 0) / 1024 / nodes / held if held > 0 else float("nan")
        row["store_cpu_steady_pct"] = 100 * (cpu3["store"] - cpu2["store"]) / held if held > 0 else float("nan")
        row["agents_cpu_steady_pct_per_node"] = 100 * (cpu3["agents"] - cpu2["agents"]) / held / max(1, nodes - 1)
        if loss:
            victim = nodes - 1
            owner = next(i for i, held_ in enumerate(job.holds) if victim in held_)
            kill_at = time.time()
            job.tell(f"kill {victim}", only=owner)
            job.tell("fail")
            again = job.wait_all("closed", CASE_S, accept=lambda e: e["round"] >= 2 and e["worlds"] == [nodes - 1])
            row["recovery_s"] = max(e["t"] for e in again.values()) - kill_at
        memory = job.host_memory_mb()  # before the host's process ends
        row["host_rss_peak_mb"] = memory.get("VmHWM", float("nan"))
        finish_at = time.time()
        job.tell("finish")
        done = job.wait_all("done", CASE_S)
        row.update(_figures(done, nodes, finish_at, loss))
        row["load_average"] = load_average()
    except ShoalError as err:
        row["error"] = err.message
    finally:
        job.close()
    return row


def _sum(marks: dict[int, dict[str, Any]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for event in marks.values():
        for k, v in event["counts"].items():
            total[k] = total.get(k, 0) + v
    return total


def _figures(done: dict[int, dict[str, Any]], nodes: int, finish_at: float, loss: bool) -> dict[str, Any]:
    """Per-node operations of the join (up to each node's first workers' start) and of the exit."""
    records = [r for event in done.values() for r in event["nodes"]]
    errors = [r["error"] for r in records if r["error"]]
    if errors:
        raise ShoalError(f"{len(errors)} node(s) failed; first: {errors[0]}", "")
    join = [r["at_start"][0] for r in records]
    join_ops = [_ops(c) for c in join]
    out: dict[str, Any] = {
        "join_ops_per_node": sum(join_ops) / len(join_ops),
        "join_ops_max": max(join_ops),
        "join_kb_per_node": sum(c.get("bytes", 0) for c in join) / 1024 / len(join),
    }
    kinds: dict[str, float] = {}
    for c in join:
        for k, v in c.items():
            if k != "bytes":
                kinds[k] = kinds.get(k, 0) + v / len(join)
    out["join_ops_by_kind"] = dict(sorted(kinds.items()))
    live = [r for r in records if not r["killed"]]
    exits = [r["exit_done"] for r in live if r["exit_done"]]
    out["exit_s"] = max(exits) - finish_at if len(exits) == len(live) else float("nan")
    if loss:
        again = [_ops(_minus(r["at_start"][1], r["at_start"][0])) for r in live if len(r["at_start"]) > 1]
        out["recovery_ops_per_node"] = sum(again) / len(again) if again else float("nan")
    return out


# -- the benchmark ----------------------------------------------------------------------------------


def measure(cfg: RendezvousScaleConfig, log: Log) -> Measured:
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    loads = []
    with tempfile.TemporaryDirectory(prefix="shoal-bench-rdzv-") as tmp:
        for nodes in cfg.nodes:
            order = [v for v in cfg.variants if not (v.endswith("c10d") and cfg.c10d_max and nodes > cfg.c10d_max)]
            if len(order) < len(cfg.variants):
                notes.append(f"c10d not simulated at {nodes} nodes (--c10d-max {cfg.c10d_max})")
            for variant in order:
                loads.append(load_average())
                case = Path(tmp) / f"{variant}-{nodes}"
                case.mkdir()
                row = run_case(variant, nodes, cfg, case)
                rows.append(row)
                log(f"  {variant} x {nodes}: " + _summary(row))
        if cfg.loss:
            nodes = max([n for n in cfg.nodes if not cfg.c10d_max or n <= cfg.c10d_max], default=0)
            for variant in [v for v in cfg.variants if v.endswith("c10d")]:
                case = Path(tmp) / f"{variant}-{nodes}-loss"
                case.mkdir()
                row = run_case(variant, nodes, cfg, case, loss=True)
                rows.append(row)
                log(f"  {variant} x {nodes}, one node lost: " + _summary(row))
    by = {(r["variant"], r["nodes"]): r for r in rows}
    for r in rows:
        base = by.get((BASELINE.get(r["variant"].split()[0], ""), r["nodes"]))
        r["vs_torch"] = (
            r["closed_s"] / base["closed_s"] if base and "closed_s" in base and "closed_s" in r else float("nan")
        )
    for r in rows:
        if "error" in r:
            notes.append(f"{r['variant']} x {r['nodes']}: {r['error']}")
    return Measured(rows, notes, meta={"load_averages": loads})


def _summary(row: dict[str, Any]) -> str:
    if "error" in row:
        return "FAILED: " + row["error"]
    parts = [f"closed {row['closed_s']:.2f} s", f"{row['join_ops_per_node']:.1f} ops/node"]
    if "recovery_s" in row:
        parts.append(f"recovery {row['recovery_s']:.2f} s")
    return ", ".join(parts)


def _f(value: Any, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, (int, float)) and value == value else "n/a"


def text(report: dict[str, Any]) -> list[str]:
    cfg = report["config"]
    rows = report["rows"]
    lines = [
        f"simulated nodes (threads, {cfg['processes']} processes + the host's), torch's agent and handlers, one "
        f"TCPStore; steady state over {cfg['hold']:g} s; ops = store requests a node sent",
        "",
        rep.table(
            [
                "variant",
                "nodes",
                "closed (s)",
                "vs torch",
                "join ops/node",
                "join KB/node",
                "steady ops/node/s",
                "steady KB/node/s",
                "store CPU join (s)",
                "store CPU steady",
                "host RSS peak",
                "exit (s)",
                "recovery (s)",
            ],
            [
                [
                    r["variant"],
                    r["nodes"],
                    _f(r.get("closed_s"), ".2f"),
                    _f(r.get("vs_torch"), ".2f"),
                    _f(r.get("join_ops_per_node"), ".1f"),
                    _f(r.get("join_kb_per_node"), ".1f"),
                    _f(r.get("steady_ops_per_node_s"), ".2f"),
                    _f(r.get("steady_kb_per_node_s"), ".1f"),
                    _f(r.get("store_cpu_join_s"), ".2f"),
                    _f(r.get("store_cpu_steady_pct"), ".0f") + " %",
                    _f(r.get("host_rss_peak_mb"), ".0f") + " MB",
                    _f(r.get("exit_s"), ".2f"),
                    _f(r.get("recovery_s"), ".2f"),
                ]
                for r in rows
            ],
            align="lrrrrrrrrrrrr",
        ),  # fmt: skip
    ]
    return lines


def draw(ax: Any, report: dict[str, Any]) -> None:
    series: dict[str, list[tuple[int, float]]] = {}
    for r in report["rows"]:
        if "closed_s" in r and " " not in r["variant"]:
            series.setdefault(r["variant"], []).append((r["nodes"], r["closed_s"]))
    for name, points in series.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("simulated nodes")
    ax.set_ylabel("seconds to a closed rendezvous")
    ax.set_title("rendezvous of N simulated nodes (2-core machine)")
    ax.legend()


BENCHMARK = Benchmark(
    name="rendezvous_scale",
    command="python -m benchmarks.rendezvous_scale",
    config=RendezvousScaleConfig,
    smoke=SMOKE,
    measure=measure,
    text=text,
    draw=draw,
    description="Simulate N nodes (torch's elastic agent in a thread each, no workers) meeting through "
    "shoal's and torch's rendezvous handlers over one TCPStore; report the seconds to a closed rendezvous, "
    "the store operations per node, the store's CPU and memory, and what losing one node costs.",
    examples="""\
examples:
  python -m benchmarks.rendezvous_scale                     # 16, 64, 256, 1000 nodes, four variants, a loss at 1000
  python -m benchmarks.rendezvous_scale --nodes 1000 --variants shoal_c10d --conf keep_alive_interval=5
  python -m benchmarks.rendezvous_scale --smoke             # 8 nodes, shoal's two backends
""",
)


if __name__ == "__main__":
    from benchmarks import main

    raise SystemExit(main("rendezvous_scale"))
