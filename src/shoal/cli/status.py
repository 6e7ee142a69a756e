"""``shoal status RUN_DIR``: where every rank of a run is, from another terminal, even on a hung job.

Reads the workers' progress files (``RUN_DIR/progress/rank-N.progress``, see :mod:`shoal.progress`)
without touching the job: no store, no collective, no signal unless ``--stacks`` asks for them. No
torch import. A fault-tolerant run (``--fault-tolerance``) also gets a table of its replica groups,
from ``RUN_DIR/replicas.jsonl`` (:mod:`shoal.train.ft.events`); each group's record is the rank
numbered as the group.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import ipaddress
import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

from shoal.env.network import is_local_address
from shoal.errors import ShoalError
from shoal.launch.watchdog import HangDetector, StragglerJudge, activity, dump_all_stacks, format_ranks
from shoal.progress import RankProgress, read_progress, run_progress_dir
from shoal.train.ft.events import GroupState, group_states, lighthouse_url, read_events

STRAGGLER_MIN_STEPS = 20
"""Steps every rank must have done before ``shoal status`` names a straggler from the running means."""

EXAMPLES = """\
examples:
  shoal status                          # the job running here (shoal run), else the newest in ./runs
  shoal status runs/digits              # one row per rank, and the verdict
  shoal status runs/digits --stacks     # also every live rank's Python stack (all threads)
  shoal status runs/digits --json       # the same as one JSON object
"""


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "status",
        help="show each rank's step, phase and speed of a running job, and whether it hangs",
        description=(
            "Show where every rank of a run on this node is (step, phase, time in it, step time, "
            "samples/s), the last checkpoint, and the verdict: running, hung, a straggler, finished."
        ),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        nargs="?",
        help="the run directory (or its progress/ directory); default: the one job running on this machine "
        "whose run directory is temporary (shoal run without --log-dir), else the newest run in ./runs "
        "(shoal train without --out)",
    )
    parser.add_argument("--stacks", action="store_true", help="dump every live rank's stack (all threads)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (machine-readable)")
    parser.set_defaults(func=main_args)
    return parser


TEMPORARY_RUN_DIRS = ("shoal-run-*", "shoal-workers-*")
"""Run directories a launcher makes when given none: ``shoal run`` without ``--log-dir``
(:data:`shoal.launch.run.RUN_DIR_PREFIX`), a function launch without a run directory
(:func:`shoal.launch.local.launch_local`). Named here so that ``shoal status`` imports no launcher."""


PROGRESS_HINT = (
    "to see each rank's step and phase here, open this rank's progress in the script: ctx = shoal.init(); "
    "progress = ctx.progress(); then progress.step_done(...) after each step (docs/WATCHDOG.md)"
)


def running_jobs(root: Path | None = None) -> list[Path]:
    """Temporary run directories under ``root`` (the temp directory) with a rank still running, or
    with no rank's record at all while the launcher that made them runs (a script that reports no
    progress)."""
    root = Path(tempfile.gettempdir()) if root is None else root
    found = []
    for pattern in TEMPORARY_RUN_DIRS:
        for run_dir in sorted(root.glob(pattern)):
            records = read_records(run_progress_dir(run_dir))
            if any(r.alive and r.phase != "done" for r in records) or (not records and launcher_pid(run_dir)):
                found.append(run_dir)
    return found


def launcher_pid(run_dir: Path) -> int | None:
    """The PID of the launcher that made the temporary run directory ``run_dir`` (its name:
    ``shoal-run-<pid>-<random>``, :func:`shoal.launch.process.temporary_run_dir`), while that
    process runs on this machine; else None."""
    for pattern in TEMPORARY_RUN_DIRS:
        prefix = pattern.rstrip("*")
        pid = run_dir.name[len(prefix) :].split("-", 1)[0] if run_dir.name.startswith(prefix) else ""
        if pid.isdigit():
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                return None
            except PermissionError:  # another user's process: it runs
                pass
            return int(pid)
    return None


DEFAULT_RUNS = Path("runs")
"""Where ``shoal train`` puts a run given no ``--out`` (``runs/<workload>-<time>``, relative to the
working directory: :func:`shoal.train.outputs.default_out_dir`)."""


def newest_run(runs: Path = DEFAULT_RUNS) -> Path | None:
    """The run under ``runs`` whose progress was written last (None when there is none)."""
    found = [(p.stat().st_mtime, d) for d in runs.glob("*") for p in progress_dir(d).glob("rank-*.progress")]
    return max(found)[1] if found else None


def find_run_dir(given: str | None) -> Path:
    """The run directory ``shoal status`` shows: the one given; else the one job running on this
    machine in a temporary run directory (``shoal run`` without ``--log-dir``, ``shoal train --nproc``
    across nodes); else the newest run under ``./runs`` (``shoal train`` without ``--out``)."""
    if given:
        return Path(given)
    jobs = running_jobs()
    if len(jobs) == 1:
        return jobs[0]
    if jobs:
        raise ShoalError(
            f"{len(jobs)} running jobs: {', '.join(str(j) for j in jobs)}",
            "pass the one you mean: shoal status RUN_DIR",
        )
    newest = newest_run()
    if newest is not None:
        return newest
    raise ShoalError(
        f"no running job found in {tempfile.gettempdir()} (shoal-run-*) and no run in ./{DEFAULT_RUNS}",
        "pass the run directory: shoal train's --out DIR, or shoal run's --log-dir DIR (without it, "
        "a shoal run keeps its progress in a temporary directory only while it runs)",
    )


def progress_dir(run_dir: Path) -> Path:
    """``RUN_DIR/progress``, or ``RUN_DIR`` itself when it holds the progress files."""
    if any(run_dir.glob("rank-*.progress")):
        return run_dir
    return run_progress_dir(run_dir)


def last_checkpoint(run_dir: Path) -> str | None:
    directory = run_dir / "checkpoints"
    names = sorted(p.name for p in directory.glob("ckpt-*") if ".tmp" not in p.name) if directory.is_dir() else []
    return names[-1] if names else None


def read_records(directory: Path) -> list[RankProgress]:
    """The records in ``directory``, those written on another node (a shared ``--out``) marked
    ``remote``: their pids and monotonic clocks are that node's, and a pid that does not exist here
    says nothing of whether the rank runs there (its own launcher watches it)."""
    return [r if _written_here(r.host) else dataclasses.replace(r, remote=True) for r in read_progress(directory)]


@functools.cache
def _written_here(host: str) -> bool:
    """Whether a record's host (the host name, or across nodes the node's address) is this node."""
    if host == socket.gethostname():
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False  # another host's name: not resolved, which could wait on DNS
    return is_local_address(host)


def in_phase_s(record: RankProgress, now_wall: float) -> float:
    # On this node the monotonic clock is exact; another node's record only has its wall clock.
    if not record.remote:
        return max(0.0, time.monotonic() - record.phase_since_mono)
    return max(0.0, now_wall - record.phase_since_wall)


def verdict(ranks: list[RankProgress], run_dir: Path) -> dict:
    """``{"state": finished|exited|hung|straggler|running, "text": one line, ...}``."""
    now = time.time()
    live = [r for r in ranks if r.phase != "done"]
    if not live:
        return {"state": "finished", "text": "finished"}
    gone = [r for r in live if not r.alive]
    if gone:
        return {
            "state": "exited",
            "text": f"{'rank' if len(gone) == 1 else 'ranks'} {format_ranks(r.rank for r in gone)} exited before finishing",
            "ranks": [r.rank for r in gone],
        }
    stalled = min(in_phase_s(r, now) for r in live)
    timeout = HangDetector().timeout(live)
    if stalled >= timeout:
        reports = sorted(run_dir.glob("hang-*/report.txt"))
        text = f"hung: no rank made progress for {stalled:.0f} s (hang timeout {timeout:.0f} s)"
        if reports:
            text += f"; report: {reports[-1]}"
        return {"state": "hung", "text": text, "stalled_s": stalled, "timeout_s": timeout}
    # One look at the running means (the monitor judges windows instead): enough steps that a blip
    # is diluted.
    compute = {r.rank: r.total_compute_s / r.steps_timed for r in live if r.steps_timed}
    enough = all(r.steps_timed >= STRAGGLER_MIN_STEPS for r in live)
    slow = StragglerJudge(persistence=1).window(compute) if enough else []
    if slow:
        others = {rank: statistics.median(v for r, v in compute.items() if r != rank) for rank in slow}
        parts = [f"rank {rank} straggles ({compute[rank] / others[rank]:.2f}x the others' compute)" for rank in slow]
        return {"state": "straggler", "text": "; ".join(parts), "ranks": slow}
    return {"state": "running", "text": "running"}


def row(record: RankProgress, now_wall: float) -> dict:
    return {
        "rank": record.rank,
        "pid": record.pid,
        "node": record.host,
        "step": record.step,
        "phase": activity(record),
        "in_phase_s": round(in_phase_s(record, now_wall), 3),
        "step_s": round(record.step_s, 6),
        "samples_per_s": round(record.samples_per_s, 1),
        "alive": record.alive,
    }


def main_args(args: argparse.Namespace) -> int:
    run_dir = find_run_dir(args.run_dir)
    if not run_dir.is_dir():
        raise ShoalError(
            f"no run directory {run_dir}",
            "pass the run directory of a job: shoal train's --out, or shoal run's --log-dir",
        )
    ranks = read_records(progress_dir(run_dir))
    events = read_events(run_dir)
    if not ranks and not events:
        pid = launcher_pid(run_dir)
        if pid is not None:
            return _no_progress(run_dir, pid, args)
        raise ShoalError(
            f"no progress files in {run_dir} (looked for {progress_dir(run_dir)}/rank-N.progress)",
            "pass the run directory of a job started by shoal train or shoal run; a `shoal run` script "
            "reports its steps once it calls ctx.progress() (ctx = shoal.init(); see docs/WATCHDOG.md)",
        )
    now = time.time()
    groups = [group_row(g, ranks, now) for g in group_states(events)]
    # A group its launcher is restarting is not a job that failed: its record waits for the new process.
    restarting = {g["group"] for g in groups if g["state"] == "dead, restarting"}
    state = verdict([r for r in ranks if r.rank not in restarting], run_dir) if ranks else _events_verdict(groups)
    rows = [row(r, now) for r in ranks]
    live = [r for r in ranks if r.alive and r.phase != "done" and not r.remote]  # a pid means something here only
    stacks = ({r.rank: "" for r in live} | dump_all_stacks(live)) if args.stacks else {}
    if args.json:
        payload = {
            "run_dir": str(run_dir),
            "ranks": rows,
            "last_checkpoint": last_checkpoint(run_dir),
            "verdict": state,
        }
        if groups:
            payload["replica_groups"] = {"lighthouse": lighthouse_url(events), "groups": groups}
        if args.stacks:
            payload["stacks"] = {str(rank): text for rank, text in stacks.items()}
        print(json.dumps(payload, indent=2))
        return _exit_status(state)
    if not args.run_dir:  # found, not given: say which
        print(f"run: {run_dir}")
    header = f"{'rank':>4} {'pid':>8} {'node':<12} {'step':>8} {'phase':<22} {'in phase':>9} {'step time':>10} {'samples/s':>10}"
    print(header)
    for r in rows:
        phase = r["phase"] if r["alive"] or r["phase"] == "done" else f"{r['phase']} (gone)"
        print(
            f"{r['rank']:>4} {r['pid']:>8} {r['node'][:12]:<12} {r['step']:>8} {phase:<22} "
            f"{r['in_phase_s']:>8.1f}s {r['step_s'] * 1e3:>8.1f}ms {r['samples_per_s']:>10.1f}"
        )
    if groups:
        print_groups(groups, lighthouse_url(events))
    print(f"last checkpoint: {last_checkpoint(run_dir) or 'none'}")
    print(f"verdict: {state['text']}")
    for rank, text in stacks.items():
        print(f"\n--- rank {rank} stack ---")
        print(text.rstrip() or "(no stack: the rank did not register the stacks signal)")
    return _exit_status(state)


def _no_progress(run_dir: Path, pid: int, args: argparse.Namespace) -> int:
    """A job whose launcher runs here but whose script writes no progress (a plain ``shoal run`` script):
    it runs, and no rank's step or phase can be shown; the HINT says how the script reports them."""
    text = f"running (launcher pid {pid}); the script reports no progress, so no rank's step or phase to show"
    state = {"state": "running", "text": text, "progress": False, "launcher_pid": pid}
    if args.json:
        payload = {"run_dir": str(run_dir), "ranks": [], "last_checkpoint": last_checkpoint(run_dir)}
        print(json.dumps({**payload, "verdict": state, "hint": PROGRESS_HINT}, indent=2))
        return 0
    if not args.run_dir:
        print(f"run: {run_dir}")
    print(f"verdict: {text}")
    print(f"HINT: {PROGRESS_HINT}")
    return 0


def group_row(group: GroupState, ranks: list[RankProgress], now_wall: float) -> dict:
    """One replica group: its events, and its progress record when its latest process wrote it
    (the step it is at, and whether it is gone or stuck); a straggler while its launcher's watch
    says it is one."""
    record = next((r for r in ranks if r.rank == group.group and r.pid == group.pid), None)
    state, step = group.state, group.step
    if state == "training" and group.straggler is not None:  # its launcher's watch named it
        state = f"straggler ({group.straggler['ratio']:.1f}x compute)"
    if record is not None and group.state == "training":
        step = max(step, record.step)
        stalled = in_phase_s(record, now_wall)
        if not record.alive and record.phase != "done":
            state = "gone"
        elif stalled >= HangDetector().timeout([record]):
            state = f"stuck in {activity(record)} for {stalled:.0f} s"
        elif group.straggler is None:
            state = f"training ({activity(record)})"
    return {
        "group": group.group,
        "node": group.node,
        "pid": group.pid,
        "starts": group.starts,
        "step": step,
        "state": state,
        "failure": group.failure(),
        "died": group.died,
        "healed": group.healed,
        "straggler": group.straggler,
    }


def print_groups(groups: list[dict], lighthouse: str | None) -> None:
    """The replica groups' table: one line each, its last failure in the last column."""
    print(f"replica groups{f' (lighthouse {lighthouse})' if lighthouse else ''}:")
    print(f"{'group':>5} {'node':<22} {'starts':>6} {'step':>8}  {'state':<24} last failure")
    for g in groups:
        print(f"{g['group']:>5} {g['node'][:22]:<22} {g['starts']:>6} {g['step']:>8}  {g['state']:<24} {g['failure']}")


def _events_verdict(groups: list[dict]) -> dict:
    """A fault-tolerant run without progress records (written before they were): from its events."""
    if all(g["state"] == "finished" for g in groups):
        return {"state": "finished", "text": "finished"}
    return {"state": "running", "text": "replica groups: " + ", ".join(f"{g['group']} {g['state']}" for g in groups)}


def _exit_status(state: dict) -> int:
    """0 while the job runs or once it finished; 1 when ranks exited before finishing (a killed or
    failed job), so that a script polling ``shoal status`` can tell."""
    return 1 if state["state"] == "exited" else 0
