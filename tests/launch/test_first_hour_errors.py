"""What a newcomer sees when something goes wrong with ``shoal run``: one account of each problem,
asserted line by line, said before any worker starts where it can be (issue 38)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import warm
from conftest import shoal_cmd
from procs import wait_for
from shoal.env.host import usable_cores
from shoal.launch.process import temporary_run_dir

START = "shoal run: {n} worker{s} on this node, rendezvous 127.0.0.1:"


def _env(tmp_path: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("SHOAL_ENV", "OMP_NUM_THREADS")}
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return {**env, "TMPDIR": str(tmp_path / "tmp"), **extra}


def _script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


@pytest.mark.multiprocess
def test_nccl_without_a_gpu_is_one_line_and_a_hint(tmp_path):
    """Issue 49: the cause is known, so no worker's traceback through torch's frames: one line naming
    the ranks, the script's line and the exception, then the HINT."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("nccl works here")
    script = _script(tmp_path, "ddp_nccl.py", 'import torch.distributed as dist\ndist.init_process_group("nccl")\n')
    proc = warm.run(
        shoal_cmd("run", "--nproc", "2", script), capture_output=True, text=True, timeout=120, env=_env(tmp_path)
    )
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 3 and lines[0].startswith(START.format(n=2, s="s")), proc.stderr
    assert lines[1:] == [
        f"shoal: error: ranks 0, 1 failed at {script}, line 2: "
        "ValueError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!",
        'HINT: the nccl backend needs GPUs and this machine has none: use init_process_group("gloo") on CPU, '
        "or shoal.init(), which picks the backend for the device",
    ]
    assert not list((tmp_path / "tmp").iterdir()), "temporary run directory left behind"


_PROBE = """\
import contextlib, io, sys
from shoal.cli.main import main
for argv in {argvs!r}:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    print(repr((code, err.getvalue().splitlines())))
print("torch" in sys.modules)
"""


def test_bad_input_and_a_syntax_error_are_said_before_torch_loads(tmp_path):
    script = _script(tmp_path, "broken.py", "import os\n\ndef f(:\n    pass\n")
    missing = str(tmp_path / "missing.py")
    argvs = [
        ["run", "--nproc", "0", script],
        ["run", "--nproc-per-node=-1", script],
        ["run", missing],
        ["run", "--nproc", "2", "--max-restarts", "1", script, "--lr", "0.1"],
    ]
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE.format(argvs=argvs)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    results = [eval(line) for line in proc.stdout.splitlines()[:-1]]
    hint_count = "HINT: give the number of worker processes, e.g. 2"
    assert results == [
        (2, ["shoal: error: --nproc must be at least 1, got 0", hint_count]),
        (2, ["shoal: error: --nproc-per-node must be at least 1, got -1", hint_count]),
        (
            2,
            [
                f"shoal: error: script not found: {missing} (working directory: {tmp_path})",
                "HINT: check the path; to run a module, use -m package.module; for a program that is not "
                "Python, add --no-python",
            ],
        ),
        (
            2,
            [
                "    def f(:",
                "          ^",
                f"shoal: error: {script}, line 3: SyntaxError: invalid syntax (no worker was started)",
                "HINT: fix that line, then run the same command again",
            ],
        ),
    ]
    assert proc.stdout.splitlines()[-1] == "False", "torch was imported"
    assert elapsed < 30  # a fraction of a second unloaded; the bound only catches a launch


@pytest.mark.multiprocess
def test_more_workers_than_cores_is_a_warning(tmp_path):
    # `true` as the workers (--no-python): the launcher's lines are what is checked, nothing else runs.
    n = usable_cores() + 1
    proc = warm.run(
        shoal_cmd("run", "--nproc", str(n), "--no-python", "true"),
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    cores = usable_cores()
    lines = proc.stderr.splitlines()
    assert lines[:2] == [
        f"shoal run: warning: {n} worker processes on {cores} usable core{'s' if cores != 1 else ''}: they take "
        "turns, and every collective waits for the one that is not running",
        f"HINT: use --nproc {cores} or fewer on this machine (more processes than cores only slow the job down)",
    ]
    assert lines[2].startswith(START.format(n=n, s="s")) and len(lines) == 3, proc.stderr


@pytest.mark.multiprocess
def test_sigusr1_reaches_the_workers_with_the_signals_the_sbatch_script_names(tmp_path):
    """What ``shoal launch slurm`` renders: ``--signal=USR1@60`` reaches each node's launcher, which
    forwards it (``--signals-to-handle``) to its workers; they checkpoint and exit (here: say so)."""
    from shoal.jobs.slurm import LAUNCHER_SIGNALS

    mark = tmp_path / "mark"
    script = _script(
        tmp_path,
        "preemptible.py",
        """\
        import os, signal, sys, time
        def stop(signum, frame):
            open(os.environ["MARK"] + ".got", "w").write(signal.Signals(signum).name)
            sys.exit(128 + signum)
        signal.signal(signal.SIGUSR1, stop)
        open(os.environ["MARK"], "w").write(str(os.getpid()))
        time.sleep(120)
        """,
    )
    cmd = shoal_cmd("run", "--nproc", "1", "--signals-to-handle", LAUNCHER_SIGNALS, script)
    proc = warm.popen(cmd, stderr=subprocess.PIPE, text=True, env=_env(tmp_path, MARK=str(mark)))
    try:
        wait_for(mark.exists, timeout=120, what="the worker's start")
        proc.send_signal(signal.SIGUSR1)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGUSR1, err
    assert (tmp_path / "mark.got").read_text() == "SIGUSR1"
    assert err.splitlines()[-1] == "shoal run: stopped by SIGUSR1; workers stopped"


def test_a_dead_launchers_run_directory_goes_at_the_next_start(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    stale = tmp_path / f"shoal-workers-{dead_pid}-abc"
    (stale / "progress").mkdir(parents=True)
    reported = tmp_path / f"shoal-workers-{dead_pid}-def"
    (reported / "hang-20260101-000000").mkdir(parents=True)  # a hang report: kept, its path was printed
    live = tmp_path / f"shoal-workers-{os.getppid()}-ghi"
    live.mkdir()
    other = tmp_path / "shoal-workers-notapid"
    other.mkdir()
    made = Path(temporary_run_dir("shoal-workers-"))
    assert made.parent == tmp_path and made.name.startswith(f"shoal-workers-{os.getpid()}-")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([made.name, reported.name, live.name, other.name])
    assert os.listdir(reported) == ["hang-20260101-000000"]


@pytest.mark.multiprocess
def test_a_restart_says_which_failure_it_follows_once(tmp_path):
    fail = str(Path(__file__).parent / "scripts" / "fail_rank1.py")
    (tmp_path / "pids").mkdir()
    proc = warm.run(
        shoal_cmd("run", "--nproc", "2", "--max-restarts", "1", fail, str(tmp_path / "pids"), "raise"),
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(tmp_path),
    )
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    restart = next(i for i, line in enumerate(lines) if line.startswith("shoal run: restarting the workers"))
    assert lines[1:3] == [
        "shoal: rank 1 failed: ValueError: boom at rank 1; its traceback:",
        "Traceback (most recent call last):",
    ]
    assert lines[restart - 1] == "ValueError: boom at rank 1"
    assert lines[restart].startswith("shoal run: restarting the workers (restart 1 of 1), 2 workers on this node")
    assert lines[-2:] == [
        "shoal: rank 0 stopped because rank 1 failed",
        "shoal: error: rank 1 failed: ValueError: boom at rank 1",
    ]
    assert proc.stderr.count("Traceback (most recent call last):") == 2  # one per attempt
