"""Injected faults under ``shoal run``, real processes: each hang is named (rank, node, phase, source
line) within 60 s, ``--on-hang stop`` fails with the report last and leaves no process, ``--on-hang
restart`` resumes and finishes, a straggler is named and a blip is not, a clean run says nothing.

The workers run tests/launch/scripts/hang_faults.py (``ctx = shoal.init(); progress =
ctx.progress()``; the fault chosen by FAULT, FAULT_RANK, FAULT_STEP).

The runs that mostly wait (for a hang timeout) run in the background, a few at a time, from the
first test that needs one (``in_background``); each test checks its own run's result. The tests
that time what they check (a straggler window, a clean run that must report nothing, the launcher's
watch before a SIGTERM) wait for those to end and run alone (``alone``).
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, wait
from dataclasses import dataclass
from pathlib import Path

import pytest

import warm
from background import Background
from cluster.helpers import Launched, clean_env, describe, shoal_on, wait_all
from cluster.netns import netns_unavailable, node_pair
from procs import alive, wait_for
from shoal.progress import read_progress

pytestmark = pytest.mark.multiprocess

SCRIPT = str(Path(__file__).parent / "scripts" / "hang_faults.py")
REPORT_HEAD = re.compile(r"^shoal: no rank made progress for \d+ s \(hang timeout \d+ s\)$", re.M)
AT_ONCE = 3
"""Background runs at a time: their waits overlap, while few enough ranks start (each imports torch,
~3 CPU-s) at once that none of them is starved for a hang timeout of 5 s."""
RUNS = Background(AT_ONCE)
"""The runs that mostly wait (tests/background.py)."""
in_background = RUNS.of


@pytest.fixture(scope="module")
def background(request, tmp_path_factory) -> Iterator[dict[str, Future]]:
    with RUNS.started(request, tmp_path_factory) as started:
        yield started


@pytest.fixture
def scenario(request, background) -> Future:
    """This test's background run."""
    return Background.scenario(request, background)


@pytest.fixture
def alone(background) -> None:
    """The background runs ended first: this test times what it checks (a hang timeout, a straggler
    window, the launcher's watch), so it runs without their start-ups beside it."""
    wait(background.values())


def _env(out: Path, **fault: str) -> dict[str, str]:
    env = clean_env(OUT=str(out), PYTHONUNBUFFERED="1")
    env.update({k: str(v) for k, v in fault.items()})
    return env


@dataclass
class Ran:
    """A ``shoal run`` that ended: its result, its log directory, the script's OUT directory, and the
    job's processes (their pid files) still running when it ended."""

    proc: subprocess.CompletedProcess
    run_dir: Path
    out: Path
    left: list[int]


def _shoal_run(tmp_path: Path, *flags: str, timeout: float = 150, **fault) -> Ran:
    run_dir, out = tmp_path / "run", tmp_path / "out"
    out.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "shoal", "run", "--nproc", "2", "--log-dir", str(run_dir), *flags, SCRIPT]
    proc = warm.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env(out, **fault))
    return Ran(proc, run_dir, out, _left_running(out))


def _pids(out: Path) -> list[int]:
    return [int(line) for path in out.glob("pid-*") for line in path.read_text().split()]


def _left_running(out: Path) -> list[int]:
    """The job's processes (their pid files under ``out``) still running."""
    return [pid for pid in _pids(out) if alive(pid)]


def _report_is_last(output: str) -> list[str]:
    """The report's lines, checked to be the output's last lines after the stop line."""
    lines = output.rstrip().splitlines()
    assert lines[-4] == "shoal run: stopped the workers: they hung (--on-hang stop)", output[-3000:]
    assert REPORT_HEAD.match(lines[-3]), output[-3000:]
    assert lines[-1].startswith("full stacks: "), output[-3000:]
    return lines[-3:]


def _stop_on_hang(tmp_path: Path, **fault: str) -> Ran:
    """``--hang-timeout 5 --on-hang stop`` with ``fault`` (checked by :func:`_stopped_on_hang`)."""
    return _shoal_run(tmp_path, "--hang-timeout", "5", "--on-hang", "stop", **fault)


def _stopped_on_hang(ran: Ran, named: str, processes: int = 3) -> list[str]:
    """A run of :func:`_stop_on_hang`: exit 124 with the report last, the report's second line
    matching ``named``, both ranks' stacks saved, and none of the job's ``processes`` left. Returns
    the report's lines."""
    proc = ran.proc
    output = proc.stdout + proc.stderr
    assert proc.returncode == 124, output[-3000:]
    report = _report_is_last(proc.stderr)
    assert re.fullmatch(named, report[1]), report
    pids = _pids(ran.out)  # both ranks', and the blocked process's (a loader worker's)
    assert len(pids) == processes and not ran.left, pids
    stacks = Path(report[2].removeprefix("full stacks: "))
    assert sorted(p.name for p in stacks.iterdir()) == ["rank-0.txt", "rank-1.txt", "report.txt"]
    assert "hang_faults.py" in (stacks / "rank-1.txt").read_text()
    return report


@in_background(functools.partial(_stop_on_hang, FAULT="block"))
def test_a_rank_blocked_in_its_step_is_named_and_stop_leaves_no_process(scenario):
    _stopped_on_hang(
        scenario.result(),
        r"rank 1 \(node \S+\) is in forward at step 5 at hang_faults\.py:\d+ in block_forever; "
        r"rank 0 waits in collective #6 at step 5 at hang_faults\.py:\d+ in main",
    )


# Rank 1 skips the all-reduce of step 5, runs one collective short to the end and waits in the
# final barrier; rank 0 waits in the all-reduce of step 39 that rank 1 never calls.
@in_background(functools.partial(_stop_on_hang, FAULT="skip", STEPS="40"))
def test_a_rank_that_skipped_an_all_reduce_is_named_where_it_waits(scenario):
    _stopped_on_hang(
        scenario.result(),
        r"rank 1 \(node \S+\) is in collective #40 at step 40 at hang_faults\.py:\d+ in main; "
        r"rank 0 waits in collective #40 at step 39 at hang_faults\.py:\d+ in main",
        processes=2,
    )


@in_background(functools.partial(_stop_on_hang, FAULT="loader"))
def test_a_data_loader_worker_that_stops_is_named_in_data(scenario):
    _stopped_on_hang(
        scenario.result(),
        r"rank 1 \(node \S+\) is in data at step 5 at hang_faults\.py:\d+ in main; "
        r"rank 0 waits in collective #6 at step 5 at hang_faults\.py:\d+ in main",
    )


@in_background(functools.partial(_stop_on_hang, FAULT="checkpoint", FAULT_STEP="10"))
def test_a_rank_stuck_in_a_checkpoint_write_is_named_in_checkpoint(scenario):
    ran = scenario.result()
    report = _stopped_on_hang(
        ran,
        r"rank 1 \(node \S+\) is in checkpoint at step 10 at hang_faults\.py:\d+ in block_forever; "
        r"rank 0 waits in collective #11 at step 10 at hang_faults\.py:\d+ in main",
    )
    verdict = json.loads((ran.run_dir / "progress" / "verdict.json").read_text())
    assert verdict["hang"] == {"line": report[1]} and verdict["stragglers"] == []


def test_an_interrupted_launcher_leaves_no_process_even_a_blocked_loader_worker(tmp_path, alone):
    # SIGTERM to the launcher while rank 1's DataLoader worker is blocked in __getitem__ (rank 1
    # waits for its batch, rank 0 in the all-reduce): torch's agent stops the ranks; the loader
    # worker, orphaned and blocked, is stopped by the launcher's watch before it returns.
    out = tmp_path / "out"
    out.mkdir()
    cmd = [sys.executable, "-m", "shoal", "run", "--nproc", "2", "--log-dir", str(tmp_path / "run"), SCRIPT]
    proc = warm.popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(out, FAULT="loader"))
    try:
        wait_for(lambda: list(out.glob("pid-blocked-*")), timeout=120, what="the loader worker to block")
        time.sleep(1.5)  # the watch has seen it (it looks every second)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "shoal run: stopped by SIGTERM" in err
    pids = _pids(out)
    assert len(pids) == 3 and not _left_running(out), pids


def _restart_on_hang(tmp_path: Path) -> Ran:
    return _shoal_run(
        tmp_path, "--hang-timeout", "5", "--on-hang", "restart", "--max-restarts", "1",
        FAULT="block", FAULT_STEP="7", FAULT_ONCE="1", STEPS="15",
    )  # fmt: skip


@pytest.mark.slow
@in_background(_restart_on_hang)
def test_on_hang_restart_resumes_from_the_checkpoint_and_finishes(scenario):
    ran = scenario.result()
    proc = ran.proc
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert len(REPORT_HEAD.findall(proc.stderr)) == 1, output[-3000:]
    assert "rank 1 (node " in proc.stderr and "is in forward at step 7" in proc.stderr
    assert "restarting the workers (restart 1 of 1)" in output, output[-3000:]
    assert "resumed at step 5" in proc.stdout and proc.stdout.rstrip().endswith("finished"), output[-3000:]
    assert not ran.left


def _report_with_defaults(tmp_path: Path) -> tuple[float | None, Path, list[int]]:
    """A hang under the default timeout and ``--on-hang report``, stopped (SIGTERM) once reported:
    when the report's first line came (None: never), the OUT directory, the job's processes left."""
    out = tmp_path / "out"
    out.mkdir()
    cmd = [sys.executable, "-m", "shoal", "run", "--nproc", "2", "--log-dir", str(tmp_path / "run"), SCRIPT]
    env = _env(out, FAULT="block", FAULT_STEP="30", STEPS="60", HANG_MARK=str(out / "hang-started"))
    proc = warm.popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    reported = None
    # No report by then: stopped, its stderr ends (no test's timeout can stop a background run).
    overdue = threading.Timer(150, os.kill, (proc.pid, signal.SIGTERM))
    overdue.start()
    try:
        for line in proc.stderr:
            if REPORT_HEAD.match(line.rstrip()):
                reported = time.time()
                break
    finally:
        overdue.cancel()
        proc.send_signal(signal.SIGTERM)  # --on-hang report: the job goes on until stopped
        proc.wait(timeout=60)
    return reported, out, _left_running(out)


@pytest.mark.slow
@in_background(_report_with_defaults, first=True)
def test_with_defaults_a_hang_is_reported_within_60_s_of_its_start(scenario):
    reported, out, left = scenario.result()
    assert reported is not None
    started = float((out / "hang-started").read_text())
    delay = reported - started
    print(f"hang start -> report with defaults: {delay:.1f} s")
    assert delay <= 60
    assert not left


def _throttle(pid_file: Path, stop: threading.Event, duty: float = 0.8, period: float = 0.05) -> None:
    """Throttle one rank's CPU the way cpu.max does: stopped ``duty`` of every ``period`` (SIGSTOP /
    SIGCONT; this machine's kernel does not enforce CFS bandwidth limits: nr_throttled stays 0)."""
    while not pid_file.exists() and not stop.is_set():
        time.sleep(0.05)
    if stop.is_set():
        return
    pid = int(pid_file.read_text().split()[0])
    try:
        while not stop.is_set():
            os.kill(pid, signal.SIGSTOP)
            time.sleep(period * duty)
            os.kill(pid, signal.SIGCONT)
            time.sleep(period * (1 - duty))
    except ProcessLookupError:
        pass
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


@pytest.mark.slow
def test_a_throttled_rank_is_named_a_straggler(tmp_path, alone):
    out = tmp_path / "out"
    out.mkdir()
    stop = threading.Event()
    throttler = threading.Thread(target=_throttle, args=(out / "pid-1", stop), daemon=True)
    throttler.start()
    try:
        ran = _shoal_run(tmp_path, COMPUTE="work", WORK_ITERS="200000", STEPS="200", SHOAL_STRAGGLER_WINDOW_S="2")
    finally:
        stop.set()
        throttler.join()
    proc = ran.proc
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    lines = re.findall(r"^shoal: rank \d+ .* straggles: .*$", proc.stderr, re.M)
    assert len(lines) == 1 and lines[0].startswith("shoal: rank 1 (node "), output[-3000:]
    verdict = json.loads((ran.run_dir / "progress" / "verdict.json").read_text())
    assert [s["rank"] for s in verdict["stragglers"]] == [1] and verdict["hang"] is None
    assert verdict["stragglers"][0]["ratio"] > 1.3 and verdict["stragglers"][0]["line"] == lines[0]
    assert "no rank made progress" not in output


@pytest.mark.parametrize("fault", ["none", "blip"])
def test_a_clean_run_or_a_blip_reports_no_hang_and_no_straggler(tmp_path, fault, alone):
    # A blip: rank 1 computes 3x longer for 10 steps (0.6 s, one window of 2 s at most).
    ran = _shoal_run(tmp_path, FAULT=fault, FAULT_STEP="40", BLIP_STEPS="10", STEPS="150", SHOAL_STRAGGLER_WINDOW_S="2")
    proc = ran.proc
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "no rank made progress" not in output and "straggles" not in output, output[-3000:]
    assert not list(ran.run_dir.glob("hang-*"))
    # The watchdog saw both ranks' every step (else "no straggler" would prove nothing), and any verdict
    # it wrote (a blip may name rank 1 for a window) ends with none.
    records = read_progress(ran.run_dir / "progress")
    assert sorted((r.rank, r.steps_timed >= 150) for r in records) == [(0, True), (1, True)], records
    verdict = ran.run_dir / "progress" / "verdict.json"
    if fault == "none":
        assert not verdict.exists(), verdict.read_text()
    else:
        assert not verdict.exists() or json.loads(verdict.read_text())["stragglers"] == []


def _two_nodes_one_hung(tmp_path: Path) -> tuple[Path, list[Launched], list[list[int]]]:
    """Two namespaced nodes, rank 3 of 4 blocked, ``--on-hang stop`` on both: the directory, their
    launchers once ended, and each node's job processes still running then (before the nodes go)."""
    reason = netns_unavailable()
    if reason:
        pytest.skip(f"two namespaced nodes cannot be made here: {reason}")
    with node_pair(subnet=22) as (a, b):
        launched = []
        for node, rank in ((a, 0), (b, 1)):
            out = tmp_path / f"out{rank}"
            out.mkdir()
            args = [
                "run", "--nproc", "2", "--nnodes", "2", "--node-rank", str(rank), "--master-addr", a.addr,
                "--master-port", "29622", "--log-dir", str(tmp_path / f"run{rank}"), "--hang-timeout", "5",
                "--on-hang", "stop", SCRIPT,
            ]  # fmt: skip
            env = _env(out, FAULT="block", FAULT_RANK="3", FAULT_STEP="5")
            launched.append(shoal_on(node, args, tmp_path / f"node{rank}.log", env=env))
        wait_all(launched, timeout=150)
        return tmp_path, launched, [_left_running(tmp_path / f"out{rank}") for rank in (0, 1)]


@pytest.mark.slow
@in_background(_two_nodes_one_hung)
def test_two_nodes_the_report_on_node_0_names_the_hung_rank_of_node_1(scenario):
    tmp_path, launched, left = scenario.result()
    text = describe(launched)
    # Both launchers report and stop (node 1 when node 0 shared its report, at the latest).
    for item in launched:
        assert item.returncode == 124, text
    node0 = launched[0].output
    named = re.search(
        r"^rank 3 \(node (\S+)\) is in forward at step 5 at hang_faults\.py:\d+ in block_forever;.*$", node0, re.M
    )
    assert named and named.group(1) == launched[1].node.addr, text
    assert re.search(r"ranks 0-2 wait in collective #6 at step 5 at hang_faults\.py:\d+ in main", named.group(0)), text
    for rank in (0, 1):
        saved = list((tmp_path / f"run{rank}").glob("hang-*/rank-*.txt"))
        assert sorted(p.name for p in saved) == [f"rank-{2 * rank}.txt", f"rank-{2 * rank + 1}.txt"], text
        assert not left[rank]
