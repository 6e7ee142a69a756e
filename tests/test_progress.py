"""The progress channel: a record written in one process reads back in another, whole, for free."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
import timeit

from shoal.progress import ENV_DIR, PHASES, STACKS_SIGNAL, ProgressWriter, read_one, read_progress


def _child(code: str, directory, **env: str) -> subprocess.Popen:
    environ = dict(os.environ, **{ENV_DIR: str(directory)}, **env)
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=environ,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_a_record_written_in_one_process_reads_back_in_another(tmp_path):
    child = _child(
        """
        import sys
        from shoal.progress import ProgressWriter
        w = ProgressWriter.from_env()
        w.phase("data", step=41)
        w.step_done(32, compute_s=0.25, wait_s=0.05)
        w.collective(); w.collective()
        print("ready", flush=True)
        sys.stdin.readline()
        w.close()
        print("closed", flush=True)
        sys.stdin.readline()
        """,
        tmp_path,
        RANK="3",
        LOCAL_RANK="1",
        WORLD_SIZE="4",
        SHOAL_NODE_NAME="node-a",
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        (record,) = read_progress(tmp_path)
        assert (record.rank, record.local_rank, record.world_size, record.pid, record.host) == (
            3,
            1,
            4,
            child.pid,
            "node-a",
        )
        assert (record.step, record.phase, record.collectives) == (42, "collective", 2)
        assert (record.step_s, record.compute_s, record.wait_s, record.samples) == (0.3, 0.25, 0.05, 32)
        assert (record.steps_timed, record.total_samples) == (1, 32)
        assert record.samples_per_s == 32 / 0.3
        assert record.stacks_signal == STACKS_SIGNAL and record.alive
        assert 0 <= time.monotonic() - record.phase_since_mono < 60
        assert abs(time.time() - record.phase_since_wall) < 60
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "closed"
        assert read_progress(tmp_path)[0].phase == "done"
    finally:
        child.kill()
        child.wait()


def test_without_the_variable_the_writer_does_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_DIR, raising=False)
    monkeypatch.chdir(tmp_path)
    writer = ProgressWriter.from_env()
    assert not writer.enabled
    writer.phase("data", 1)
    writer.collective()
    writer.step_done(8, 0.1, 0.0)
    writer.close()
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(STACKS_SIGNAL) == signal.SIG_DFL


def test_reads_are_never_torn_while_a_writer_hammers_the_record(tmp_path):
    # Every write keeps invariants inside each region; a torn copy would mix two writes.
    child = _child(
        """
        from shoal.progress import ProgressWriter, PHASES
        w = ProgressWriter.from_env()
        print("ready", flush=True)
        for i in range(1, 10**9):
            w.step_done(i, compute_s=float(i), wait_s=float(i))
            w.phase(PHASES[i % 8], step=i * 7)
        """,
        tmp_path,
        RANK="0",
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        path = tmp_path / "rank-0.progress"
        seqs, checked = set(), 0
        # Until many reads of many different writes are checked (a loaded machine gives the
        # writer fewer turns a second: the count, not a time, says when the proof is made).
        deadline = time.monotonic() + 120
        while (checked <= 1000 or len(seqs) <= 100) and time.monotonic() < deadline:
            r = read_one(path)
            assert r is not None
            assert r.compute_s == r.wait_s == r.samples and r.step_s == 2 * r.samples
            assert r.total_samples == r.samples * (r.samples + 1) // 2 and r.steps_timed == r.samples
            if r.step % 7 == 0 and r.step:
                assert r.phase == PHASES[(r.step // 7) % 8]
            seqs.add(r.seq)
            checked += 1
        assert checked > 1000 and len(seqs) > 100  # many reads, of many different writes
    finally:
        child.kill()
        child.wait()


def test_a_program_with_its_own_handler_keeps_it(tmp_path):
    def mine(*_):
        pass

    previous = signal.signal(STACKS_SIGNAL, mine)
    try:
        writer = ProgressWriter(tmp_path, 0)
        assert signal.getsignal(STACKS_SIGNAL) is mine
        assert read_progress(tmp_path)[0].stacks_signal == 0  # so nobody sends it
        writer.close()
    finally:
        signal.signal(STACKS_SIGNAL, previous)


def test_cost_of_a_phase_call_and_of_a_step(tmp_path):
    """The figure for docs/BENCHMARKS.md, "The watchdog" (printed with -s); a time is not asserted (shared machines)."""
    writer = ProgressWriter(tmp_path, 0, stacks=False)

    def step():
        writer.phase("data")
        writer.phase("forward")
        writer.phase("backward")
        writer.phase("optimizer")
        writer.step_done(32, 0.001, 0.0)

    number = 20000
    phase_s = min(timeit.repeat(lambda: writer.phase("forward"), number=number, repeat=3)) / number
    step_s = min(timeit.repeat(step, number=number, repeat=3)) / number
    off = ProgressWriter(None)
    off_step_s = min(timeit.repeat(lambda: off.phase("forward"), number=number, repeat=3)) / number
    print(
        f"\nphase(): {phase_s * 1e6:.2f} us; a step's calls: {step_s * 1e6:.2f} us; disabled phase(): {off_step_s * 1e6:.2f} us"
    )
    assert read_one(writer.path).steps_timed == 3 * number
    writer.close()


def test_an_untimed_step_counts_but_leaves_the_timed_totals(tmp_path):
    writer = ProgressWriter(tmp_path, 0, stacks=False)
    writer.step_done(8, 0.5, 0.1, timed=False)  # a first step after a start: slow, not the pace
    writer.step_done(8, 0.01, 0.002)
    record = read_one(writer.path)
    assert (record.step, record.steps_timed, record.total_samples) == (2, 1, 8)
    assert (record.total_compute_s, record.total_wait_s) == (0.01, 0.002)
    writer.close()


def test_a_restarted_writer_replaces_the_record_without_truncating_it(tmp_path):
    first = ProgressWriter(tmp_path, 2, stacks=False)
    first.step_done(8, 0.1)
    old = os.stat(first.path).st_ino
    second = ProgressWriter(tmp_path, 2, stacks=False)  # a new attempt's worker for the same rank
    assert os.stat(second.path).st_ino != old  # a new file renamed over: readers of the old one keep it
    (record,) = read_progress(tmp_path)
    assert (record.steps_timed, record.step) == (0, 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank-2.progress"]
    first.close()
    second.close()


def test_a_summary_for_the_other_nodes_round_trips_marked_remote(tmp_path):
    from shoal.progress import from_summary, to_summary

    writer = ProgressWriter(tmp_path, 1, stacks=False)
    writer.phase("backward", 9)
    writer.step_done(16, 0.02, 0.01)
    local = read_progress(tmp_path)
    data = to_summary(local)
    assert len(data) < 1024
    (remote,) = from_summary(data)
    assert remote.remote and not local[0].remote
    assert (remote.rank, remote.step, remote.phase, remote.total_samples) == (1, 10, "backward", 16)
    assert dataclasses.replace(remote, remote=False, path=local[0].path) == local[0]
    writer.close()


def test_a_worker_whose_launcher_has_ended_makes_no_run_directory_again(tmp_path, monkeypatch):
    """A rank still starting when its launcher has removed its run directory (``shoal-workers-*`` in
    the temporary directory) gets a writer that does nothing, and the directory stays gone."""
    run_dir = tmp_path / "shoal-workers-ended"
    monkeypatch.setenv(ENV_DIR, str(run_dir / "progress"))
    writer = ProgressWriter.from_env(1)
    assert not writer.enabled
    writer.phase("forward", 3)
    writer.step_done(8, 0.01)
    writer.close()
    assert not run_dir.exists()
    # While the launcher's directory is there, the same call writes the rank's record into it.
    (run_dir / "progress").mkdir(parents=True)
    writer = ProgressWriter.from_env(1, stacks=False)
    writer.step_done(8, 0.01)
    assert [(r.rank, r.steps_timed) for r in read_progress(run_dir / "progress")] == [(1, 1)]
    writer.close()
