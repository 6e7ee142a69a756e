"""``python -m benchmarks.lighthouse_scale``: torchft's lighthouse under 2 to 1,000 simulated replica groups.

For each size N of ``--groups``: the real Rust lighthouse, started as shoal starts it (the command of
``shoal.train.ft.lighthouse.Lighthouse``: shoal's entry point and ``shoal.env.replica``'s flags),
and N simulated groups in ``--processes`` processes (:mod:`benchmarks.lighthouse_scale_groups`):
each group is torchft's own manager server and client without a model, heartbeating every
``--heartbeat-interval-ms`` (torchft's default, which shoal keeps) and asking for a quorum every
step with its replica id, address and step, then "training" ``--step-s`` seconds. One group dies
where it would ask for the quorum of step ``steps - 2`` (its manager stops: no more heartbeats).

Measured, with every group's clock the same machine's monotonic clock:

* ``first quorum``: from the last group's request of step 0 (the job's first quorum) to the moment
  the last group has its answer;
* ``step quorum``: the same for every later step before the death (the lighthouse's "fast
  quorum": the same members again), median and worst;
* ``dead out``: from the death to the moment the last survivor has a quorum without it;
* ``left out``: live groups that a quorum left out (a group whose heartbeat the lighthouse saw
  too late counts as dead), and quorum calls that failed;
* the lighthouse process's CPU (``/proc/PID/stat``) while the groups only heartbeat, and per step
  while they train; its peak resident memory (``VmHWM``).

Targets (issue 45): at 1,000 groups a quorum <= 1 s after the last join, a dead group out within
the heartbeat timeout + 1 s. ``--heartbeat-timeout-ms``, ``--join-timeout-ms`` and
``--quorum-tick-ms`` and ``--heartbeat-interval-ms`` replace shoal's values to try others (0: shoal's,
which depend on the number of groups: :func:`shoal.env.replica.heartbeat_ms`).

What it cannot show: the simulated groups share this machine's cores with the lighthouse (a real
job's managers each run on their own node), so the latencies here are upper bounds; loopback has
no network latency or loss; a group of one process (a real group's other ranks only talk to its
own manager server).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import lighthouse_scale_groups as sim
from shoal.bench import report as rep
from shoal.bench.harness import Benchmark, Log, Measured, flag
from shoal.bench.timing import load_average, median
from shoal.errors import ShoalError
from shoal.launch.ports import find_free_port

# shoal's lighthouse, named in this one place (issue 45 moves fault tolerance into one room: a move
# is fixed on these two lines). QUORUM_TIMEOUT_S is shoal.distributed.fault_tolerance's, whose module
# imports torch: its value is repeated here.
from shoal.env.replica import HEARTBEAT_TIMEOUT_MS, JOIN_TIMEOUT_MS, QUORUM_TICK_MS, heartbeat_ms  # isort: skip
from shoal.train.ft.lighthouse import QUORUM_RETRIES, Lighthouse  # isort: skip

QUORUM_TIMEOUT_S = 30.0
QUORUM_TARGET_S = 1.0
DEAD_SLACK_S = 1.0
"""The target for a dead group: out within the heartbeat timeout + this."""
STATUS_EVERY_S = 0.5
"""How often the lighthouse's /status page is read for the age of its oldest heartbeat of a live group."""
_HEARTBEAT_AGE = re.compile(r"sim_group_(\d+):[0-9a-f-]+: seen ([0-9.e+-]+)s ago")
IDLE_WINDOW_S = 2.0
"""How long the lighthouse's CPU is sampled while every group only heartbeats."""


@dataclass(frozen=True)
class LighthouseScaleConfig:
    """What ``python -m benchmarks.lighthouse_scale`` measures."""

    groups: tuple[int, ...] = field(
        default=(2, 8, 64, 256, 1000),
        metadata=flag(parse=rep.parse_int_list, metavar="N,N,...", default="2,8,64,256,1000"),
    )
    """Comma-separated numbers of simulated replica groups, one lighthouse each."""
    steps: int = 8
    """Steps per size; one group dies at step ``steps - 2``."""
    step_s: float = 1.0
    """Seconds each group "trains" between its quorums."""
    processes: int = 4
    """Processes that hold the simulated groups (fewer when there are fewer groups)."""
    heartbeat_interval_ms: int = 0
    """Each group's heartbeat period (0: shoal's for the number of groups)."""
    heartbeat_timeout_ms: int = 0
    """The lighthouse's --heartbeat_timeout_ms (0: shoal's)."""
    join_timeout_ms: int = 0
    """The lighthouse's --join_timeout_ms (0: shoal's)."""
    quorum_tick_ms: int = 0
    """The lighthouse's --quorum_tick_ms (0: shoal's)."""

    def __post_init__(self) -> None:
        if not self.groups or any(n < 2 for n in self.groups):
            raise ShoalError(f"--groups must be 2 or more each, got {list(self.groups)}", "pass --groups 2,8,64")
        if self.steps < 4:
            raise ShoalError(f"--steps must be 4 or more, got {self.steps}", "pass --steps 8")
        if self.processes < 1 or self.step_s < 0 or self.heartbeat_interval_ms < 0:
            raise ShoalError(
                "--processes must be at least 1, --step-s and --heartbeat-interval-ms at least 0",
                "pass --processes 4 --step-s 1",
            )
        if min(self.heartbeat_timeout_ms, self.join_timeout_ms, self.quorum_tick_ms) < 0:
            raise ShoalError("the lighthouse's timeouts must be 0 (shoal's) or more", "pass 0 or leave them out")

    def settings(self) -> dict[str, int]:
        """The lighthouse's flags as run: shoal's values where the config says 0."""
        return {
            "heartbeat_timeout_ms": self.heartbeat_timeout_ms or HEARTBEAT_TIMEOUT_MS,
            "join_timeout_ms": self.join_timeout_ms or JOIN_TIMEOUT_MS,
            "quorum_tick_ms": self.quorum_tick_ms or QUORUM_TICK_MS,
        }

    def settings_for(self, groups: int) -> tuple[dict[str, int], int]:
        """The lighthouse's flags and the groups' heartbeat interval (ms) for a job of ``groups``:
        shoal's for that size (:func:`shoal.env.replica.heartbeat_ms`) where the config says 0."""
        timeout, interval = heartbeat_ms(groups)
        settings = {**self.settings(), "heartbeat_timeout_ms": self.heartbeat_timeout_ms or timeout}
        return settings, self.heartbeat_interval_ms or interval


SMOKE = dict(groups=(4,), steps=4, step_s=0.3, processes=1)
"""``--smoke``: 4 groups in one process, 4 steps; one dies at step 2 and is left out."""


def lighthouse_command(port: int, settings: dict[str, int]) -> list[str]:
    """The command shoal runs its lighthouse with, on ``127.0.0.1:port``, with ``settings``' values."""
    argv = Lighthouse("127.0.0.1", port, min_replicas=1).command()
    for name, value in settings.items():
        at = argv.index(f"--{name}")  # shoal passes every one of them: a missing one is a real change
        argv[at + 1] = str(value)
    return argv


class _LighthouseProcess:
    """The lighthouse as a child process (it dies with this one), its CPU and memory from /proc."""

    def __init__(self, settings: dict[str, int], log_path: Path) -> None:
        self.port = find_free_port("127.0.0.1")
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k != "TOKIO_WORKER_THREADS"}
        env["RUST_LOG"] = os.environ.get("RUST_LOG", "warn")
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            lighthouse_command(self.port, settings),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
        self.log_path = log_path

    def wait_listening(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ShoalError(f"the lighthouse exited ({self.process.returncode}): {self._tail()}", "see its log")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return
            time.sleep(0.05)
        raise ShoalError(f"the lighthouse did not listen within {timeout_s:.0f} s", "is the machine overloaded?")

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def memory(self) -> dict[str, float]:
        status = Path(f"/proc/{self.process.pid}/status").read_text().splitlines()
        values = dict(line.split(":", 1) for line in status if ":" in line)
        values = {key: value.split()[0] for key, value in values.items() if value.split()}
        return {
            "peak_rss_mib": int(values["VmHWM"]) / 1024,
            "rss_mib": int(values["VmRSS"]) / 1024,
            "threads": int(values["Threads"]),
            "open_files": len(os.listdir(f"/proc/{self.process.pid}/fd")),  # a connection per group
        }

    def watch_heartbeats(self, skip: int, stop: threading.Event, ages: list[float]) -> None:
        """Until ``stop``: every STATUS_EVERY_S, the age of the oldest heartbeat the lighthouse holds of
        a live group (its /status page; group ``skip``, the one that dies, left out), into ``ages``."""
        while not stop.wait(STATUS_EVERY_S):
            try:
                with urllib.request.urlopen(f"{self.url}/status", timeout=5) as answer:
                    page = answer.read().decode(errors="replace")
            except OSError:
                continue
            seen = [float(age) for group, age in _HEARTBEAT_AGE.findall(page) if int(group) != skip]
            if seen:
                ages.append(max(seen))

    def _tail(self) -> str:
        self._log.flush()
        return " ".join(self.log_path.read_text(errors="replace").split()[-30:])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


def _die_with_parent() -> None:
    """In the lighthouse's process, before exec: SIGKILL when this benchmark's process ends."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _split(groups: list[int], parts: int) -> list[list[int]]:
    parts = max(1, min(parts, len(groups)))
    return [groups[i::parts] for i in range(parts)]


def measure_size(cfg: LighthouseScaleConfig, n: int, work: Path, log: Log) -> dict[str, Any]:
    """One lighthouse, ``n`` groups, ``cfg.steps`` steps, one death; the row of size ``n``."""
    settings, interval_ms = cfg.settings_for(n)
    die_at = cfg.steps - 2
    victim = n - 1
    lighthouse = _LighthouseProcess(settings, work / f"lighthouse-{n}.log")
    context = multiprocessing.get_context("spawn")
    workers: list[tuple[Any, Any]] = []
    load = load_average()
    ages: list[float] = []
    watch_stop = threading.Event()
    try:
        lighthouse.wait_listening()
        base = {
            "lighthouse": lighthouse.url, "heartbeat_ms": interval_ms, "steps": cfg.steps,
            "step_s": cfg.step_s, "quorum_timeout_s": QUORUM_TIMEOUT_S, "connect_timeout_s": QUORUM_TIMEOUT_S,
            "quorum_retries": QUORUM_RETRIES, "victim": victim, "die_at": die_at,
        }  # fmt: skip
        started = time.monotonic()
        for share in _split(list(range(n)), cfg.processes):
            parent, child = context.Pipe()
            process = context.Process(target=sim.run_groups, args=(child, {**base, "groups": share}), daemon=True)
            process.start()
            child.close()
            workers.append((process, parent))
        for process, conn in workers:
            state, created, errors = _receive(conn, process, 120 + n * 0.2)
            if errors:
                raise ShoalError(f"simulated groups failed to start: {errors[0]}", "see the lighthouse's log")
        created_s = time.monotonic() - started
        watcher = threading.Thread(
            target=lighthouse.watch_heartbeats, args=(victim, watch_stop, ages), name="lighthouse-status", daemon=True
        )
        watcher.start()
        # Every group heartbeats now and none has asked for a quorum: the lighthouse's idle cost.
        time.sleep(0.5)
        cpu0, t0 = lighthouse.cpu_s(), time.monotonic()
        time.sleep(IDLE_WINDOW_S)
        idle_pct = 100 * (lighthouse.cpu_s() - cpu0) / (time.monotonic() - t0)
        cpu1, t1 = lighthouse.cpu_s(), time.monotonic()
        for _, conn in workers:
            conn.send(("go",))
        records: list[tuple] = []
        deaths: list[tuple[int, float]] = []
        budget = cfg.steps * (cfg.step_s + QUORUM_TIMEOUT_S) + 60
        for process, conn in workers:
            _, got, died = _receive(conn, process, budget)
            records += got
            deaths += died
        run_cpu, run_s = lighthouse.cpu_s() - cpu1, time.monotonic() - t1
        memory = lighthouse.memory()
        watch_stop.set()
        watcher.join(timeout=10)
    finally:
        watch_stop.set()
        for process, conn in workers:
            with contextlib.suppress(OSError):
                conn.send(("stop",))
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join()
        lighthouse.stop()
    row = _row(n, records, deaths, die_at, settings)
    row.update(
        created_s=created_s, idle_cpu_pct=idle_pct, cpu_s_per_step=run_cpu / cfg.steps, run_cpu_pct=100 * run_cpu / run_s,
        load_average=load, heartbeat_age_max_s=max(ages, default=float("nan")), heartbeat_interval_ms=interval_ms,
        heartbeat_timeout_ms=settings["heartbeat_timeout_ms"], **memory,
    )  # fmt: skip
    log(
        f"  {n} groups: first quorum {_s(row['first_quorum_s'])}, step quorum {_s(row['step_quorum_s'])} "
        f"(worst {_s(row['step_quorum_worst_s'])}), dead out {_s(row['dead_out_s'])}, left out {row['left_out']}, "
        f"failed {row['failed']}; lighthouse {idle_pct:.1f}% CPU idle, {row['cpu_s_per_step']:.3f} CPU-s/step, "
        f"{memory['peak_rss_mib']:.0f} MiB"
    )
    return row


def _receive(conn: Any, process: Any, timeout_s: float) -> tuple:
    if not conn.poll(timeout_s):
        raise ShoalError(f"simulated groups gave no answer within {timeout_s:.0f} s", "is the machine overloaded?")
    try:
        return conn.recv()
    except EOFError:
        process.join(timeout=5)
        raise ShoalError(f"a process of simulated groups died (exit {process.exitcode})", "run it again") from None


def _row(
    n: int, records: list[tuple], deaths: list[tuple[int, float]], die_at: int, settings: dict[str, int]
) -> dict[str, Any]:
    by_step: dict[int, list[tuple]] = {}
    for record in records:
        by_step.setdefault(record[1], []).append(record)
    failed = sum(1 for r in records if r[4] < 0)
    ok = [r for r in records if r[4] >= 0]
    # Live groups left out: at each step, the groups alive less the smallest quorum any of them got.
    left_out = 0
    for step, got in by_step.items():
        sizes = [r[5] for r in got if r[4] >= 0]
        if sizes:
            left_out += max(0, (n if step < die_at else n - 1) - min(sizes))

    def after_last_join(step: int) -> float:
        got = [r for r in by_step.get(step, []) if r[4] >= 0]
        return max(r[3] for r in got) - max(r[2] for r in got) if got else float("nan")

    def first_answer(step: int) -> float:
        got = [r for r in by_step.get(step, []) if r[4] >= 0]
        return min(r[3] for r in got) - max(r[2] for r in got) if got else float("nan")

    steady = [after_last_join(s) for s in range(1, die_at)]
    dead_out = float("nan")
    if deaths:
        survivors = [r for r in by_step.get(die_at, []) if r[4] >= 0 and r[5] == n - 1]
        if len(survivors) == n - 1:
            dead_out = max(r[3] for r in survivors) - deaths[0][1]
    quorum_target_met = after_last_join(0) <= QUORUM_TARGET_S and max(steady, default=0) <= QUORUM_TARGET_S
    dead_target = settings["heartbeat_timeout_ms"] / 1000 + DEAD_SLACK_S
    return {
        "groups": n,
        "first_quorum_s": after_last_join(0),
        "step_quorum_s": median(steady),
        "step_quorum_worst_s": max(steady, default=float("nan")),
        "step_quorum_runs": steady,
        # The lighthouse's share: its first answer (the quorum formed and one answer sent); the rest
        # of "step quorum" is the fan-out of N answers and the groups' own handling of them. Below
        # zero: a group had its answer before the last one asked (a quorum without every live group).
        "step_first_answer_s": median([first_answer(s) for s in range(1, die_at)]),
        "dead_out_s": dead_out,
        "dead_target_s": dead_target,
        "left_out": left_out,
        "failed": failed,
        "quorum_ids": len({r[4] for r in ok}),
        "quorum_target_met": bool(quorum_target_met and not failed),
        "dead_target_met": bool(dead_out <= dead_target),
        "failures": sorted({r[6] for r in records if r[6]})[:3],
    }


def measure(cfg: LighthouseScaleConfig, log: Log) -> Measured:
    rows = []
    with tempfile.TemporaryDirectory(prefix="shoal-bench-lighthouse-") as tmp:
        for n in cfg.groups:
            rows.append(measure_size(cfg, n, Path(tmp), log))
    settings = cfg.settings()
    notes = []
    for row in rows:
        misses = []
        if not row["quorum_target_met"]:
            misses.append(f"quorum after the last join over {QUORUM_TARGET_S:g} s")
        if not row["dead_target_met"]:
            misses.append(f"dead group out after more than {row['dead_target_s']:g} s")
        if row["left_out"] or row["failed"]:
            misses.append(
                f"{row['left_out']} live group(s) left out of a quorum, {row['failed']} quorum call(s) failed"
            )
        if misses:
            notes.append(f"{row['groups']} groups: " + "; ".join(misses) + _failure_note(row))
    return Measured(
        rows,
        notes,
        config={**settings, "heartbeat_timeout_ms_asked": cfg.heartbeat_timeout_ms,
                "shoal_settings": {"heartbeat_timeout_ms": HEARTBEAT_TIMEOUT_MS, "join_timeout_ms": JOIN_TIMEOUT_MS,
                "quorum_tick_ms": QUORUM_TICK_MS}},
        meta={"load_averages": [r["load_average"] for r in rows]},
    )  # fmt: skip


def _failure_note(row: dict[str, Any]) -> str:
    return f" (first error: {row['failures'][0]})" if row["failures"] else ""


def _s(value: float) -> str:
    return f"{value:.3f} s" if value == value else "n/a"


def text(report: dict[str, Any]) -> list[str]:
    cfg = report["config"]
    by_size = "; per size: " + ", ".join(
        f"{r['groups']} groups {r['heartbeat_timeout_ms']}/{r['heartbeat_interval_ms']} ms" for r in report["rows"]
    )
    return [
        f"torchft's lighthouse (--heartbeat_timeout_ms {cfg['heartbeat_timeout_ms']} --join_timeout_ms "
        f"{cfg['join_timeout_ms']} --quorum_tick_ms {cfg['quorum_tick_ms']}); simulated groups heartbeat, "
        f"ask for a quorum every {cfg['step_s']:g} s of 'training', "
        f"{cfg['steps']} steps, one dies at step {cfg['steps'] - 2}; seconds after the last group asked" + by_size,
        "",
        rep.table(
            [
                "groups",
                "first quorum",
                "step quorum",
                "worst step",
                "1st answer",
                "dead out",
                "left out",
                "failed",
                "oldest HB",
                "LH CPU idle",
                "LH CPU/step",
                "LH peak RSS",
                "load",
            ],
            [
                [
                    str(r["groups"]),
                    _s(r["first_quorum_s"]),
                    _s(r["step_quorum_s"]),
                    _s(r["step_quorum_worst_s"]),
                    _s(r["step_first_answer_s"]) if not r["step_first_answer_s"] < 0 else "split",
                    _s(r["dead_out_s"]),
                    str(r["left_out"]),
                    str(r["failed"]),
                    _s(r["heartbeat_age_max_s"]),
                    f"{r['idle_cpu_pct']:.1f}%",
                    f"{r['cpu_s_per_step']:.3f} s",
                    f"{r['peak_rss_mib']:.0f} MiB",
                    f"{r['load_average']:.1f}" if r["load_average"] is not None else "n/a",
                ]
                for r in report["rows"]
            ],
            align="rrrrrrrrrrrrr",
        ),
    ]


def draw(ax: Any, report: dict[str, Any]) -> None:
    rows = report["rows"]
    sizes = [r["groups"] for r in rows]
    ax.plot(sizes, [r["first_quorum_s"] for r in rows], "o-", label="first quorum after the last join")
    ax.plot(sizes, [r["step_quorum_worst_s"] for r in rows], "s-", label="step quorum after the last join (worst)")
    ax.plot(sizes, [r["dead_out_s"] for r in rows], "^-", label="dead group out, after its death")
    ax.axhline(QUORUM_TARGET_S, color="grey", linestyle=":", label=f"quorum target ({QUORUM_TARGET_S:g} s)")
    ax.plot(sizes, [r["dead_target_s"] for r in rows], color="grey", linestyle="--", label="dead-group target")
    ax.set_xscale("log")
    ax.set_yscale("log")  # milliseconds at 2 groups, tens of seconds where a size breaks down
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.set_xlabel("simulated replica groups")
    ax.set_ylabel("seconds")
    asked = report["config"].get("heartbeat_timeout_ms_asked")
    settings = f"heartbeat timeout {asked} ms" if asked else "shoal's heartbeats by size"
    ax.set_title(f"torchft lighthouse, {settings}")
    ax.legend(fontsize="small")


BENCHMARK = Benchmark(
    name="lighthouse_scale",
    command="python -m benchmarks.lighthouse_scale",
    config=LighthouseScaleConfig,
    smoke=SMOKE,
    measure=measure,
    text=text,
    draw=draw,
    description="Start torchft's lighthouse as shoal does and N simulated replica groups (torchft's own manager "
    "server and client, no model): seconds to a quorum after the last group asked, to leave a dead group out, "
    "the lighthouse's CPU and memory, at each N.",
    examples="""\
examples:
  python -m benchmarks.lighthouse_scale                      # 2, 8, 64, 256 and 1,000 groups
  python -m benchmarks.lighthouse_scale --groups 1000 --heartbeat-timeout-ms 3000 --json lh.json
  python -m benchmarks.lighthouse_scale --smoke              # 4 groups, one dies: seconds
""",
)


if __name__ == "__main__":
    from benchmarks import main

    raise SystemExit(main("lighthouse_scale"))
