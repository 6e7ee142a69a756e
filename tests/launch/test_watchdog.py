"""The watchdog: hang and straggler judgements over snapshots, and against real gloo jobs the stacks of
a rank blocked in all_reduce, a real hang reported with the odd rank's source line, a slow rank of
``shoal train`` named a straggler, and a blocked rank that SIGTERM cannot stop stopped by SIGKILL."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_shoal
from procs import alive, launcher_free_env, wait_for
from progress_job import start_job, stop_job
from shoal.errors import ShoalError
from shoal.launch.watchdog import (
    Hang,
    HangDetector,
    Monitor,
    StragglerJudge,
    dump_all_stacks,
    dump_stacks,
    format_ranks,
    hang_options,
    hang_report,
    stop_processes,
    where,
)
from shoal.launch.watchdog.processes import stat_fields
from shoal.progress import ProgressWriter, RankProgress, read_progress


def rec(
    rank: int, *, step: int = 57, phase: str = "collective", seq: int = 2, step_s: float = 0.1, **kw
) -> RankProgress:
    fields = dict(
        rank=rank, pid=1000 + rank, local_rank=rank, world_size=4, host=f"n{rank // 2}", started_wall=0.0,
        stacks_signal=12, seq=seq, step=step, phase=phase, collectives=1204, phase_since_mono=0.0,
        phase_since_wall=0.0, step_s=step_s, compute_s=step_s, wait_s=0.0, samples=32, steps_timed=step,
        total_samples=32 * step, total_compute_s=step_s * step, total_wait_s=0.0,
    )  # fmt: skip
    fields.update(kw)
    return RankProgress(**fields)


STACK = """\
Thread 0x00007f00aaaa (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f00bbbb (most recent call first):
  File "/x/.venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 1200 in _next_data
  File "/home/me/project/train.py", line 88 in load_batch
  File "/home/me/project/train.py", line 120 in <module>
"""
WAITING = """\
Current thread 0x00007f00cccc (most recent call first):
  File "/x/.venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 4181 in all_reduce
  File "/x/.venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/home/me/project/train.py", line 40 in <module>
"""


def test_format_ranks():
    assert format_ranks([5, 0, 2, 1]) == "0-2, 5"
    assert format_ranks([3]) == "3"


def test_no_hang_while_any_rank_progresses():
    detector = HangDetector()
    for t in range(0, 200, 5):
        assert detector.observe(float(t), [rec(0, seq=2 * t + 2), rec(1, phase="data")]) is None


def test_a_stall_past_the_timeout_is_reported_once_per_hang():
    detector = HangDetector()
    ranks = [rec(0), rec(1, phase="data")]
    assert detector.observe(0.0, ranks) is None
    assert detector.observe(29.0, ranks) is None
    hang = detector.observe(30.0, ranks)
    assert hang is not None and (hang.stalled_s, hang.timeout_s) == (30.0, 30.0)
    assert detector.observe(31.0, ranks) is None  # the same hang
    moved = [rec(0, seq=4), rec(1, phase="data")]
    assert detector.observe(40.0, moved) is None
    assert detector.observe(70.0, moved) is not None  # a new one


def test_finished_ranks_do_not_count_as_hung():
    detector = HangDetector()
    done = [rec(0, phase="done"), rec(1, phase="done")]
    assert detector.observe(0.0, done) is None
    assert detector.observe(1000.0, done) is None


def test_the_timeout_follows_the_step_time_after_warm_up():
    detector = HangDetector()
    assert detector.timeout([rec(0, step_s=0.01), rec(1, step_s=0.01)]) == 30.0  # the floor
    assert detector.timeout([rec(0, step_s=5.0), rec(1, step_s=5.0)]) == 50.0  # 10 x the step time
    assert detector.timeout([rec(0, step_s=5.0, steps_timed=1), rec(1, step_s=5.0)]) == 30.0  # warming up
    assert detector.timeout([rec(0, phase="checkpoint"), rec(1, phase="start")]) == 120.0  # slow phases
    assert HangDetector(timeout_s=7).timeout([rec(0, step_s=5.0)]) == 7


def test_the_report_names_the_odd_rank_out_and_its_source_line():
    detector = HangDetector(timeout_s=30)
    ranks = [rec(0), rec(1, phase="data"), rec(2), rec(3)]
    detector.observe(0.0, ranks)
    hang = detector.observe(31.0, ranks)
    report = hang_report(hang, {0: WAITING, 1: STACK, 2: WAITING, 3: WAITING}, saved_in="RUN/hang-1")
    assert report.splitlines() == [
        "shoal: no rank made progress for 31 s (hang timeout 30 s)",
        "rank 1 (node n0) is in data at step 57 at train.py:88 in load_batch; "
        "ranks 0, 2-3 wait in collective #1204 at step 57 at train.py:40 in <module>",
        "full stacks: RUN/hang-1",
    ]


def test_with_two_ranks_the_one_not_waiting_is_the_odd_one():
    hang = HangDetector(timeout_s=1)
    ranks = [rec(0, phase="data"), rec(1)]
    hang.observe(0.0, ranks)
    report = hang_report(hang.observe(2.0, ranks), {})
    assert "rank 0 (node n0) is in data at step 57; rank 1 waits in collective #1204 at step 57" in report


def test_where_skips_library_frames_and_other_threads():
    assert where(STACK) == "train.py:88 in load_batch"
    assert where(WAITING) == "train.py:40 in <module>"
    assert where("") == ""


def test_a_persistent_straggler_is_named_and_a_blip_is_not():
    judge = StragglerJudge(margin=1.3, persistence=3)
    normal = {0: 0.010, 1: 0.011, 2: 0.010, 3: 0.0105}
    assert judge.window({**normal, 2: 0.05}) == []  # a blip
    assert judge.window(normal) == []
    assert judge.window({**normal, 3: 0.02}) == []
    assert judge.window({**normal, 3: 0.02}) == []
    assert judge.window({**normal, 3: 0.02}) == [3]
    assert judge.window({**normal, 3: 0.012}) == []  # within the margin again


# -- real processes --------------------------------------------------------------------------------


def _ranks(directory, n=2):
    ranks = read_progress(directory)
    return ranks if len(ranks) == n else []


def _inside_the_all_reduce(directory) -> bool:
    """Rank 0's stack is in ``all_reduce`` and its main thread sleeps (in gloo's C++ wait, where a
    Python signal handler cannot run), not between the phase store and the call."""
    ranks = _ranks(directory)
    if not ranks:
        return False
    state = stat_fields(ranks[0].pid)
    return state is not None and state[0] == "S" and "in all_reduce" in dump_stacks(ranks[0])


def _blocked(directory, hang_step):
    """Rank 1 stuck in data loading at ``hang_step`` while rank 0 entered the all_reduce."""
    ranks = _ranks(directory)
    return bool(ranks) and (ranks[0].phase, ranks[0].step, ranks[1].phase, ranks[1].step) == (
        "collective", hang_step, "data", hang_step
    )  # fmt: skip


@pytest.mark.multiprocess
def test_the_stack_of_a_rank_blocked_in_a_gloo_all_reduce_is_dumped(tmp_path):
    procs = start_job(tmp_path, HANG_RANK="1", HANG_STEP="3")
    try:
        wait_for(lambda: _blocked(tmp_path, 3) and _inside_the_all_reduce(tmp_path), timeout=120)
        waiting, sleeping = read_progress(tmp_path)
        text = dump_stacks(waiting)
        assert "in all_reduce" in text and "progress_worker.py" in text, text
        assert where(text).startswith("progress_worker.py:") and where(text).endswith("in <module>")
        assert where(dump_stacks(sleeping)).endswith("in load_batch")
        started = time.monotonic()
        both = dump_all_stacks([waiting, sleeping])  # signals first, then collected: as long as one
        assert time.monotonic() - started < 2.0
        assert "in all_reduce" in both[0] and "in load_batch" in both[1]
        assert waiting.alive and sleeping.alive  # a dump does not stop anyone
        assert procs[0].poll() is None
    finally:
        stop_job(procs)


@pytest.mark.multiprocess
def test_the_monitor_reports_a_real_hang_within_its_timeout(tmp_path):
    progress, events = tmp_path / "progress", []
    procs = start_job(progress, HANG_RANK="1", HANG_STEP="10")
    monitor = Monitor(progress, tmp_path, detector=HangDetector(timeout_s=3.0), on_hang=events.append, interval_s=0.25)
    monitor.start()
    try:
        wait_for(lambda: events, timeout=180)
        (event,) = events
        hang_started = max(r.phase_since_wall for r in read_progress(progress))
        took = time.time() - hang_started
        assert took < 3.0 + 5.0, took  # timeout + polls + stack dumps
        lines = event.report.splitlines()
        assert lines[1].startswith("rank 1 (node ") and " is in data at step 10 at progress_worker.py:" in lines[1]
        assert "in load_batch; rank 0 waits in collective #11 at step 10 at progress_worker.py:" in lines[1]
        assert lines[2] == f"full stacks: {event.directory}"
        assert {p.name for p in event.directory.iterdir()} == {"rank-0.txt", "rank-1.txt", "report.txt"}
        assert "in all_reduce" in (event.directory / "rank-0.txt").read_text()
        assert (
            "time.sleep" in (event.directory / "rank-1.txt").read_text()
            or "load_batch" in (event.directory / "rank-1.txt").read_text()
        )
        print("\n" + event.report)
    finally:
        monitor.stop()
        stop_job(procs)


@pytest.mark.multiprocess
def test_the_monitor_names_a_persistent_straggler(tmp_path):
    progress, lines = tmp_path / "progress", []
    # 0.2 s of compute against 0.01 s: a sleep's overshoot on a loaded machine (tens of ms, added to
    # both ranks) cannot bring the ratio under the judge's 1.3 margin, as it did with 0.03 s.
    procs = start_job(progress, SLOW_RANK="1", SLOW_S="0.2")
    monitor = Monitor(progress, tmp_path, on_straggler=lines.append, interval_s=0.25, window_s=1.0)
    try:
        wait_for(lambda: all(r.steps_timed >= 3 for r in _ranks(progress)), timeout=120)
        monitor.start()
        wait_for(lambda: lines, timeout=30)
        assert lines[0].startswith("shoal: rank 1 (node ") and " straggles: " in lines[0], lines
        assert monitor.stragglers == {1}
        assert not monitor.events
    finally:
        monitor.stop()
        stop_job(procs)


SLOW_GROUP = Path(__file__).parents[1] / "train" / "ft" / "scripts" / "slow_group.py"


@pytest.mark.multiprocess
def test_a_slow_rank_of_shoal_train_is_named_a_straggler(tmp_path):
    """2 ranks of a real ``shoal train`` (DDP over gloo), rank 1 sleeping 30 ms in every forward: DDP's
    all-reduce makes rank 0 wait for it inside its backward, which the trainer counts as wait, so rank
    0's record shows its own compute and rank 1 is named (the line, verdict.json, metrics.jsonl)."""
    out = tmp_path / "run"
    env = launcher_free_env(SLOW_RANK="1", SLOW_S="0.03", SHOAL_STRAGGLER_WINDOW_S="1")
    cmd = ["train", f"{SLOW_GROUP}:SlowGroup", "--nproc", "2", "--device", "cpu", "--out", str(out)]
    proc = run_shoal(*cmd, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = re.findall(r"^shoal: rank \d+ .* straggles: .*$", proc.stderr, re.M)
    assert len(lines) == 1 and lines[0].startswith("shoal: rank 1 (node "), proc.stderr[-3000:]
    verdict = json.loads((out / "progress" / "verdict.json").read_text())
    assert [(s["rank"], s["line"]) for s in verdict["stragglers"]] == [(1, lines[0])], verdict
    (epoch,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert epoch["stragglers"] == lines, epoch
    fast, slow = sorted(read_progress(out / "progress"), key=lambda r: r.rank)
    per_step = {r.rank: (r.total_compute_s / r.steps_timed, r.total_wait_s / r.steps_timed) for r in (fast, slow)}
    assert slow.steps_timed == fast.steps_timed == 150, per_step
    assert per_step[1][0] > 0.03 > 3 * per_step[0][0], per_step  # rank 0's compute is its own...
    assert per_step[0][1] > 0.02, per_step  # ...and it waited for rank 1


@pytest.mark.multiprocess
def test_stop_processes_kills_a_rank_that_sigterm_cannot_stop(tmp_path):
    # Rank 0 waits in all_reduce with a Python SIGTERM handler (as shoal.preemption installs): the
    # handler does not run inside the collective, so only SIGKILL stops it.
    procs = start_job(tmp_path, HANG_RANK="1", HANG_STEP="2", TERM_HANDLER="1")
    try:
        wait_for(lambda: _blocked(tmp_path, 2) and _inside_the_all_reduce(tmp_path), timeout=120)
        started = time.monotonic()
        assert stop_processes([procs[0].pid], grace_s=2.0) == [procs[0].pid]
        assert 2.0 <= time.monotonic() - started < 10
        assert procs[0].wait(timeout=5) == -9
        # The sleeping rank runs its handler: SIGTERM is enough.
        assert stop_processes([procs[1].pid], grace_s=10.0) == []
        assert procs[1].wait(timeout=5) == 143
    finally:
        stop_job(procs)


def test_stop_processes_on_nothing_left():
    assert stop_processes([], grace_s=1.0) == []


def test_no_signal_is_sent_to_a_rank_without_the_stacks_handler():
    # SIGUSR2's default action terminates: a rank that did not register it must not get it.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert dump_stacks(rec(0, pid=child.pid, stacks_signal=0), timeout_s=1) == ""
        time.sleep(0.3)
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


@pytest.mark.multiprocess
def test_two_launchers_share_progress_through_a_real_store_and_name_the_other_nodes_rank(tmp_path, monkeypatch):
    # Two "nodes" (two progress directories, two monitors) sharing through a torch TCPStore as the
    # launchers' rendezvous store would: node A's monitor names node B's stuck rank.
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    writers = {}
    for node, rank in (("node-a", 0), ("node-b", 1)):
        monkeypatch.setenv("SHOAL_NODE_NAME", node)
        writers[node] = ProgressWriter(tmp_path / node / "progress", rank, stacks=False)
    writers["node-a"].phase("data", 5)
    writers["node-a"].collective()
    writers["node-b"].phase("data", 5)

    def monitor(node, other, events):
        return Monitor(
            tmp_path / node / "progress", tmp_path / node, detector=HangDetector(timeout_s=1.0),
            on_hang=events.append, interval_s=0.1, share_s=0.2,
            publish=lambda data: store.set(f"progress/{node}", data),
            peers=lambda: [store.get(f"progress/{other}")] if store.check([f"progress/{other}"]) else [],
        )  # fmt: skip

    events_a, events_b = [], []
    monitors = [monitor("node-a", "node-b", events_a).start(), monitor("node-b", "node-a", events_b).start()]
    try:
        wait_for(lambda: events_a and events_b, timeout=30)
        for events in (events_a, events_b):
            assert events[0].report.splitlines()[1] == (
                "rank 1 (node node-b) is in data at step 5; rank 0 waits in collective #1 at step 5"
            )
        # Each launcher saves only its own ranks' stacks.
        assert {p.name for p in events_a[0].directory.iterdir()} == {"rank-0.txt", "report.txt"}
        assert {p.name for p in events_b[0].directory.iterdir()} == {"rank-1.txt", "report.txt"}
    finally:
        for m in monitors:
            m.stop()
        for w in writers.values():
            w.close()


def test_hang_options_are_checked_with_a_hint():
    assert hang_options(None) == (None, "report")
    assert hang_options("90", "stop") == (90.0, "stop")
    for bad in ("0", "-5", "soon", "nan", "inf"):
        with pytest.raises(ShoalError, match="--hang-timeout") as err:
            hang_options(bad)
        assert err.value.hint
    with pytest.raises(ShoalError, match="--on-hang 'kill'"):
        hang_options(None, "kill")


# -- the verdict file, remote places, the launch's watch ------------------------------------------


def _window(monitor, compute: dict[int, float], steps: int) -> None:
    """One straggler window of ``steps`` steps at ``compute`` seconds each, per rank."""
    ranks = []
    for rank, c in compute.items():
        before = monitor._window_start.get(rank, (0, 0.0))
        ranks.append(
            rec(rank, step=before[0] + steps, steps_timed=before[0] + steps, total_compute_s=before[1] + c * steps)
        )
    monitor._judge(ranks)


def test_the_verdict_file_follows_stragglers_with_the_same_persistence_both_ways(tmp_path):
    path = tmp_path / "progress" / "verdict.json"
    lines = []
    monitor = Monitor(tmp_path / "progress", tmp_path, verdict_path=path, on_straggler=lines.append)
    normal = {0: 0.010, 1: 0.010, 2: 0.011}
    _window(monitor, {**normal, 2: 0.05}, 10)  # a blip: nothing written, nothing said
    assert not path.exists() and lines == []
    for _ in range(3):
        _window(monitor, {**normal, 1: 0.03}, 10)
    verdict = json.loads(path.read_text())
    assert [(s["rank"], s["node"], s["ratio"]) for s in verdict["stragglers"]] == [(1, "n0", 2.86)]
    assert verdict["stragglers"][0]["line"] == lines[0] and len(lines) == 1 and verdict["hang"] is None
    assert lines[0].startswith("shoal: rank 1 (node n0) straggles: 30.0 ms of compute per step vs 10.5 ms")
    _window(monitor, normal, 10)  # one window at the others' pace: still named
    _window(monitor, {0: 0.0, 1: 0.0, 2: 0.0}, 0)  # no step at all (a hang): the verdict stands
    _window(monitor, normal, 10)
    assert [s["rank"] for s in json.loads(path.read_text())["stragglers"]] == [1]
    _window(monitor, normal, 10)  # the third calm window in a row: gone
    assert json.loads(path.read_text())["stragglers"] == [] and len(lines) == 1


def test_a_hang_and_its_end_are_written_to_the_verdict_file(tmp_path):
    directory = tmp_path / "progress"
    writers = [ProgressWriter(directory, rank, stacks=False) for rank in (0, 1)]
    writers[0].collective()
    writers[1].phase("data", 0)
    monitor = Monitor(directory, tmp_path, detector=HangDetector(timeout_s=5), verdict_path=directory / "verdict.json")
    try:
        assert monitor.poll(now=100.0) is None
        event = monitor.poll(now=106.0)
        assert event is not None
        verdict = json.loads((directory / "verdict.json").read_text())
        assert verdict["hang"] == {"line": event.report.splitlines()[1]} and verdict["stragglers"] == []
        assert verdict["hang"]["line"].startswith("rank 1 (node ")
        writers[1].phase("forward")
        assert monitor.poll(now=107.0) is None
        assert json.loads((directory / "verdict.json").read_text())["hang"] is None
    finally:
        for w in writers:
            w.close()


def test_the_report_gives_another_nodes_rank_the_place_its_launcher_shared():
    hang = Hang(
        40.0, 30.0, [rec(0), rec(1), rec(2), rec(3, phase="data", remote=True, where="train.py:88 in load_batch")]
    )
    report = hang_report(hang, {0: WAITING, 1: WAITING, 2: WAITING})
    assert report.splitlines()[1] == (
        "rank 3 (node n1) is in data at step 57 at train.py:88 in load_batch; "
        "ranks 0-2 wait in collective #1204 at step 57 at train.py:40 in <module>"
    )


def test_summaries_carry_the_place_and_ignore_fields_they_do_not_know():
    from shoal.progress import from_summary, to_summary

    data = json.loads(to_summary([rec(1, where="train.py:88 in load_batch")]))
    data[0]["from_a_newer_launcher"] = 1
    (back,) = from_summary(json.dumps(data).encode())
    assert back.remote and back.where == "train.py:88 in load_batch" and back.rank == 1


def test_the_watch_stops_the_workers_descendants_too(tmp_path):
    # A worker (a child of this process) with a child of its own that ignores its parent's end, as
    # a DataLoader worker blocked in __getitem__ does: closing the watch leaves neither.
    from shoal.launch.watchdog import JobWatch

    watch = JobWatch(tmp_path)
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)"
    worker = subprocess.Popen([sys.executable, "-c", code])
    try:
        wait_for(lambda: len(watch.track()) == 2, timeout=30)
        tree = watch.track()
        worker.kill()  # the worker goes first (its child is orphaned, as when torch's agent stops it)
        worker.wait()
        watch.close(grace_s=1.0)
        assert all(not alive(pid) for pid in tree)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


@pytest.mark.multiprocess
def test_a_report_stops_waiting_for_the_other_nodes_once_their_store_is_gone_and_settle_waits_for_it(
    tmp_path, monkeypatch
):
    # Node 1's launcher declares a hang that names node 0's rank and waits for node 0's stacks
    # (its `where`); node 0 hosts the store, acts on the hang first and exits. A real TCPStore in a
    # process of its own, killed mid-wait: the report ends at once instead of after peer_wait_s, and
    # settle() (what the launch core calls when the workers fail) returns once it has been acted on,
    # so the launcher tells the workers' end as the hang (exit 124), not as node 0's failure (75).
    # (CI, 2026-11-24: node 1 exited 75 in test_hang_faults' two-node test.)
    from datetime import timedelta

    from torch.distributed import TCPStore

    from shoal.launch.watchdog import JobWatch
    from shoal.progress import to_summary

    host = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from torch.distributed import TCPStore\n"
         "s = TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False); print(s.port, flush=True)\n"
         "time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        store = TCPStore("127.0.0.1", int(host.stdout.readline()), is_master=False, timeout=timedelta(seconds=3))
        store.set("progress/node-0", to_summary([rec(0, host="node-0", step=5, world_size=2)]))  # no `where`
        monkeypatch.setenv("SHOAL_NODE_NAME", "node-1")
        monkeypatch.setenv("WORLD_SIZE", "2")
        watch = JobWatch(
            tmp_path, hang_timeout=1.0, publish=lambda data: store.set("progress/node-1", data),
            peers=lambda: [store.get("progress/node-0")],
        )  # fmt: skip
        watch.monitor.peer_wait_s = 120.0
        watch.start()  # a new attempt: the records of the last go
        writer = ProgressWriter(tmp_path / "progress", 1, stacks=False)
        writer.phase("forward", 5)
        try:
            wait_for(lambda: not watch.monitor.idle.is_set(), timeout=30)
            host.kill()
            host.wait()
            begun = time.monotonic()
            watch.settle()
            assert watch.monitor.idle.is_set() and time.monotonic() - begun < 30
            (event,) = watch.monitor.events
            assert (
                event.report.splitlines()[1]
                == "rank 1 (node node-1) is in forward at step 5; rank 0 waits in collective #1204 at step 5"
            )
        finally:
            watch.close(grace_s=1.0)
            writer.close()
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
