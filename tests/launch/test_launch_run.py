"""``shoal run``: real worker processes over gloo on CPU, started by torch's elastic agent.

Multi-process tests cost about 2 CPU-s a worker that joins a process group (it imports torch). The
command line's own checks (flags, a missing script) are in tests/cli/test_run_args.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

import warm
from conftest import shoal_cmd
from procs import alive, diagnose_stuck, kill_group, start_cmd

SCRIPTS = Path(__file__).parent / "scripts"
ALLREDUCE = str(SCRIPTS / "allreduce.py")
FAIL = str(SCRIPTS / "fail_rank1.py")
STEPS = str(Path(__file__).parents[1] / "cluster" / "scripts" / "steps.py")
STARTUP = re.compile(
    r"^shoal run: (\d+) workers? on this node, rendezvous (\S+):(\d+)( \(free port picked\))?, "
    r"OMP_NUM_THREADS=(\d+)( \(yours\))?, listening on 127.0.0.1 only$",
    re.M,
)
THREADS = re.compile(r"OMP_NUM_THREADS=(\d+)( \([^)]*\))?, listening on")  # start and restart lines


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def _results(out: Path, n: int) -> list[dict]:
    found = sorted(out.glob("rank*.json"))
    assert len(found) == n, f"expected {n} result files, got {[p.name for p in found]}"
    results = [json.loads(p.read_text()) for p in found]
    assert sorted(r["rank"] for r in results) == list(range(n))
    return results


def _assert_no_worker_left(pid_dir: Path, n: int) -> None:
    pids = [int(p.read_text()) for p in pid_dir.glob("rank*.pid")]
    assert len(pids) == n
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)], "worker processes left running"


def _env(tmp_path: Path, **extra: str) -> dict:
    """A private TMPDIR (to check shoal's temporary log dir is removed) and no OMP_NUM_THREADS."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    env = {"TMPDIR": str(tmp), **extra}
    return env


def _clean_env(env: dict) -> dict:
    full = dict(os.environ)
    full.pop("OMP_NUM_THREADS", None)
    full.pop("SHOAL_ENV", None)
    full.update(env)
    return full


def _run(*args: str, tmp_path: Path, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    return warm.run(
        shoal_cmd("run", *args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_clean_env(_env(tmp_path, **env)),
    )


# --- real launches -----------------------------------------------------------------------


@pytest.mark.multiprocess
def test_two_jobs_at_once_each_get_a_free_port(tmp_path):
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        out.mkdir()
    env = _clean_env(_env(tmp_path))
    spellings = [["--nproc", "2"], ["--nproc_per_node=2"]]
    procs = [
        warm.popen(
            shoal_cmd("run", *flags, ALLREDUCE, str(out)),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for flags, out in zip(spellings, outs)
    ]
    errs = [p.communicate(timeout=180)[1].decode() for p in procs]
    threads = max(1, _cores() // 2)
    ports = []
    for proc, err, out in zip(procs, errs, outs):
        assert proc.returncode == 0, err
        results = _results(out, 2)
        assert {r["sum"] for r in results} == {3.0}
        assert {r["world_size"] for r in results} == {2}
        assert sorted(r["local_rank"] for r in results) == [0, 1]
        assert {r["omp_num_threads"] for r in results} == {str(threads)}
        assert {r["torch_threads"] for r in results} == {threads}
        line = STARTUP.search(err)
        assert line, err
        assert line.group(1) == "2" and line.group(4) and line.group(5) == str(threads)
        assert {r["master_port"] for r in results} == {line.group(3)}
        assert "Setting OMP_NUM_THREADS" not in err  # torchrun's warning
        # The worker's stderr reaches the console byte for byte while it is also logged.
        assert "\nstep 1/2\rstep 2/2\r\n" in err
        ports.append(line.group(3))
    assert ports[0] != ports[1]
    assert not list((tmp_path / "tmp").iterdir()), "temporary log dir left behind"


@pytest.mark.multiprocess
def test_an_explicit_port_and_the_users_thread_count(tmp_path):
    # 2 workers show the port and the thread count reaching each of them; a third would cost one
    # more torch import (3 ranks: test_a_rank_that_never_joins_is_named_by_those_that_waited).
    from shoal.launch.ports import find_free_port

    out = tmp_path / "out"
    out.mkdir()
    port = find_free_port()
    proc = _run(
        "--nproc-per-node",
        "2",
        f"--master_port={port}",
        ALLREDUCE,
        str(out),
        tmp_path=tmp_path,
        OMP_NUM_THREADS="5",
    )
    assert proc.returncode == 0, proc.stderr
    results = _results(out, 2)
    assert {r["sum"] for r in results} == {3.0}
    assert {r["master_port"] for r in results} == {str(port)}
    assert {r["omp_num_threads"] for r in results} == {"5"}
    line = STARTUP.search(proc.stderr)
    assert line and line.group(1) == "2" and line.group(3) == str(port), proc.stderr
    assert not line.group(4) and line.group(5) == "5" and line.group(6)


@pytest.mark.multiprocess
def test_failing_rank_shows_its_own_traceback_and_no_worker_survives(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    # stderr to a file this time (as with `shoal run ... 2> log`): the traceback is still found.
    log = tmp_path / "stderr.txt"
    start = time.monotonic()
    with open(log, "w") as stderr:
        proc = warm.run(
            shoal_cmd("run", "--nproc", "2", FAIL, str(pids), "raise"),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=_clean_env(_env(tmp_path)),
            timeout=120,
        )
    elapsed = time.monotonic() - start
    err = log.read_text()
    assert proc.returncode == 1, err
    # The failing rank's traceback once (not torch's copy too), the stopped rank in one line, and
    # none of torch's agent lines ("Terminating process ... via signal SIGTERM").
    lines = err.splitlines()
    assert STARTUP.match(lines[0]) and lines[0].startswith("shoal run: 2 workers"), err
    assert lines[1:4] == [
        "shoal: rank 1 (local rank 1) failed with exit code 1; its traceback:",
        "Traceback (most recent call last):",
        f'  File "{FAIL}", line 38, in <module>',
    ]
    assert lines[-5:] == [
        '  File "' + FAIL + '", line 30, in check',
        '    raise ValueError(f"boom at rank {value}")',
        "ValueError: boom at rank 1",
        "shoal: rank 0 stopped because rank 1 failed",
        "shoal: error: rank 1 failed: ValueError: boom at rank 1",
    ], err
    assert err.count("Traceback") == 1 and "[rank" not in err and "Terminating" not in err, err
    _assert_no_worker_left(pids, 2)
    assert elapsed < 110  # rank 0 sleeps 120 s: the agent stopped it rather than waiting for it
    assert not list((tmp_path / "tmp").iterdir()), "temporary log dir left behind"


@pytest.mark.multiprocess
def test_worker_killed_by_a_signal(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    proc = _run("--nproc", "2", FAIL, str(pids), "sigkill", tmp_path=tmp_path)
    assert proc.returncode == 128 + 9, proc.stderr
    assert "shoal: rank 1 (local rank 1) was killed by SIGKILL (9)" in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    # rank 0 died of the broken connection right after: a consequence, not the root cause
    assert last.startswith("shoal: error: rank 1 failed: killed by SIGKILL"), proc.stderr
    _assert_no_worker_left(pids, 2)


@pytest.mark.multiprocess
def test_a_rank_that_never_joins_is_named_by_those_that_waited(tmp_path):
    # gloo's full mesh waits for each peer's key in the launcher's store; the key names the rank.
    start = time.monotonic()
    proc = _run("--nproc", "3", str(SCRIPTS / "late_rank.py"), tmp_path=tmp_path, SHOAL_INIT_TIMEOUT="4")
    assert proc.returncode == 1, proc.stderr
    summary = proc.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        r"shoal: error: rank [01] failed: shoal.errors.ShoalError: rank [01] of 3 timed out after 4 s joining the "
        r"process group at 127\.0\.0\.1:\d+ \(torchrun\): rank 2 never arrived(; rank [01] failed too)?",
        summary,
    ), proc.stderr
    assert time.monotonic() - start < 60  # rank 2 sleeps 300 s: the launcher stopped it


@pytest.mark.multiprocess
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_workers_die_with_the_launcher(tmp_path, sig):
    # SIGTERM: the agent stops the workers. SIGKILL: nothing runs in the launcher any more; the
    # kernel kills the workers (PR_SET_PDEATHSIG).
    pids = tmp_path / "pids"
    pids.mkdir()
    # PYTHONFAULTHANDLER: should the launcher not exit, diagnose_stuck gets its threads' stacks.
    proc = warm.popen(
        shoal_cmd("run", "--nproc", "2", str(SCRIPTS / "sleep_forever.py"), str(pids)),
        env=_clean_env(_env(tmp_path, PYTHONFAULTHANDLER="1")),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while len(list(pids.glob("rank*.pid"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(sig)  # the pid files are renamed into place: both are complete
    try:
        # torch's agent gives the workers up to 30 s after its SIGTERM before SIGKILL
        err = proc.communicate(timeout=90)[1]
    except subprocess.TimeoutExpired:
        pytest.fail(f"the launcher did not exit within 90 s of {sig.name}\n{diagnose_stuck(proc)}")
    assert proc.returncode == (128 + sig if sig == signal.SIGTERM else -sig), err
    _assert_no_worker_left(pids, 2)
    if sig == signal.SIGTERM:
        assert "shoal run: stopped by SIGTERM" in err
        assert not list((tmp_path / "tmp").iterdir()), "temporary log dir left behind"


def _restarted(tmp_path: Path, nproc: int = 2, **env: str) -> tuple[int, str, Path]:
    """``shoal run --nproc NPROC --max-restarts 1`` of steps.py whose last rank SIGKILLs itself in the
    first attempt, in the environment of ``_run`` without TORCHELASTIC_RUN_ID (a launch not inside
    torchrun), plus ``env``: the exit code, stderr and the results directory."""
    out = tmp_path / "out"
    out.mkdir()
    full = _clean_env(_env(tmp_path, **env))
    full.pop("TORCHELASTIC_RUN_ID", None)
    argv = ["--nproc", str(nproc), "--max-restarts", "1", STEPS, str(out), "--die-rank", str(nproc - 1)]
    proc = start_cmd(*shoal_cmd("run", *argv), env=full)
    try:
        _, err = proc.communicate(timeout=180)
    finally:
        kill_group(proc)
    return proc.returncode, err, out


@pytest.fixture(scope="module")
def restarted(tmp_path_factory) -> tuple[int, str, Path]:
    """One such launch with no OMP_NUM_THREADS in its environment, shared by the restart test and the
    start lines' test below (unset): the same command, each asserting its own claim on it."""
    return _restarted(tmp_path_factory.mktemp("restarted"))


@pytest.mark.multiprocess
def test_a_killed_worker_is_restarted_with_max_restarts(restarted):
    # The restarted group gets a fresh store (TORCH_DISABLE_SHARE_RDZV_TCP_STORE): with torch's
    # shared one, the new workers read the dead ones' gloo addresses (pytorch#135712).
    code, err, out = restarted
    assert code == 0, err
    assert "shoal run: restarting the workers (restart 1 of 1), 2 workers on this node" in err
    results = _results(out, 2)
    assert {r["attempt"] for r in results} == {1} and {r["sum"] for r in results} == {12.0}


@pytest.mark.multiprocess
@pytest.mark.parametrize("omp", [None, "3"], ids=["unset", "users"])
def test_shoal_run_says_yours_only_for_the_users_value_at_start_and_restart(omp, tmp_path, request):
    # Who chose OMP_NUM_THREADS (tests/launch/test_threads_note.py has shoal train's lines): shoal's
    # own value, put into the workers' environment before they start, used to be reported as the user's.
    # The user's value is the same whatever the worker count: one worker, restarted, says it.
    if omp is None:
        code, err, _ = request.getfixturevalue("restarted")
    else:
        code, err, _ = _restarted(tmp_path, nproc=1, OMP_NUM_THREADS=omp)
    assert code == 0, err
    notes = [(m.group(1), m.group(2) or "") for m in THREADS.finditer(err)]
    assert len(notes) == 2, err  # the first start and the restart
    if omp is None:
        assert notes == [(str(max(1, _cores() // 2)), "")] * 2, err
    else:
        assert notes == [("3", " (yours)")] * 2, err


# --- refused before anything starts; the caller left as it was ---------------------------------


def test_port_in_use_is_a_one_line_error_before_anything_starts(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _run("--nproc", "2", "--master-port", str(port), ALLREDUCE, str(tmp_path), tmp_path=tmp_path)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        f"shoal: error: port {port} is already in use on this machine",
        "HINT: pick another --master-port, or omit it to get a free one",
    ]


def _environ_of_a_worker():
    return dict(os.environ)


def test_launching_leaves_os_environ_alone(monkeypatch):
    # The core sets OMP_NUM_THREADS and the interface variables for the workers only; torch's
    # launcher writes TORCHELASTIC_SIGNALS_TO_HANDLE: a library call must leave its caller as it was.
    from shoal.launch.local import launch_local

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = dict(os.environ)
    seen = launch_local(_environ_of_a_worker, (), 1, start_method="fork")[0]
    assert dict(os.environ) == before
    assert seen["OMP_NUM_THREADS"] and seen["GLOO_SOCKET_IFNAME"] == "lo"


@pytest.mark.multiprocess
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed")
def test_under_mpirun_every_copy_stops_instead_of_training_alone(tmp_path):
    """``mpirun -np 2 shoal run SCRIPT``: each copy is a rank of mpirun's job and would start a
    standalone job of its own; it stops with one line and a HINT, and the script never runs."""
    script = tmp_path / "train.py"
    script.write_text("open(__file__ + '.ran', 'a').close()\n")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OMPI_", "PMI_", "PMIX_", "SLURM_"))
        and k not in ("SHOAL_ENV", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    }
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    argv = ["mpirun", "-np", "2", "--oversubscribe", *shoal_cmd("run", str(script))]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    # Each copy stops before torch loads: mpirun may end the other copy before it has said so.
    said = [rank for rank in (0, 1) if f"shoal: error: openmpi started this process as rank {rank} of 2" in out]
    assert said, out
    assert out.count("HINT: mpirun starts every process itself") == len(said) and "Traceback" not in out
    assert not (tmp_path / "train.py.ran").exists()
