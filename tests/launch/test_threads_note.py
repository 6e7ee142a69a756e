"""The start lines say who chose OMP_NUM_THREADS: ``(yours)`` only when the user's environment set
it, nothing when shoal picked it (shoal's own value, put into the workers' environment before they
start, used to be reported as the user's). ``shoal run``'s start and restart lines are checked in
tests/launch/test_launch_run.py, where the unset case shares the restart test's launch."""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest

from procs import checkpoints, kill_group, start_cmd, wait_for, workers

THREADS = re.compile(r"OMP_NUM_THREADS=(\d+)( \([^)]*\))?, listening on")


def _env(tmp_path: Path, omp: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "SHOAL_ENV", "TORCHELASTIC_RUN_ID")}
    env["TMPDIR"] = str(tmp_path)
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    return env


def _notes(stderr: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2) or "") for m in THREADS.finditer(stderr)]


def _shoals_threads() -> str:
    return str(max(1, len(os.sched_getaffinity(0)) // 2))


@pytest.mark.multiprocess
@pytest.mark.parametrize("omp", [None, "1"], ids=["unset", "users"])
def test_shoal_train_restart_line_says_yours_only_for_the_users_value(omp, tmp_path):
    # shoal train prints its own start line; the launcher's line comes with a restart: a worker
    # SIGKILLed once the first checkpoint is on disk.
    run = tmp_path / "run"
    cmd = ["train", "digits", "--nproc", "2", "--epochs", "2", "--max-restarts", "1", "--out", str(run)]
    proc = start_cmd(sys.executable, "-m", "shoal", *cmd, env=_env(tmp_path, omp))
    try:
        wait_for(lambda: checkpoints(run / "checkpoints") or proc.poll() is not None, timeout=150)
        victims = workers(proc.pid)
        assert proc.poll() is None and len(victims) == 2, "the job ended before a worker could be killed"
        os.kill(victims[1], signal.SIGKILL)
        _, err = proc.communicate(timeout=180)
    finally:
        kill_group(proc)
    assert proc.returncode == 0, err
    assert "restarting the workers (restart 1 of 1)" in err, err
    expected = (_shoals_threads(), "") if omp is None else ("1", " (yours)")
    assert _notes(err) == [expected], err


@pytest.mark.parametrize(
    "environ, note",
    [
        ({}, f", OMP_NUM_THREADS={_shoals_threads()}"),
        ({"OMP_NUM_THREADS": "4"}, ", OMP_NUM_THREADS=4 (yours)"),
        # Inside a torchrun worker: torchrun sets 1 unless its caller had set a value.
        ({"OMP_NUM_THREADS": "1", "TORCHELASTIC_RUN_ID": "x"}, ", OMP_NUM_THREADS=1 (inherited through torchrun)"),
    ],
    ids=["unset", "users", "torchrun"],
)
def test_who_set_the_threads_is_read_from_the_environment_the_launch_began_in(environ, note):
    from types import SimpleNamespace

    from shoal.launch.core import _threads_note

    assert _threads_note(SimpleNamespace(nproc_per_node=2), environ) == note


def test_the_note_counts_every_nodes_workers_when_all_run_here():
    from types import SimpleNamespace

    from shoal.launch.core import _threads_note

    cores = len(os.sched_getaffinity(0))
    assert _threads_note(SimpleNamespace(nproc_per_node=1), {}, nodes_here=2) == (
        f", OMP_NUM_THREADS={max(1, cores // 2)} ({cores} cores for the 2 nodes' 2 workers on this machine)"
    )


@pytest.mark.multiprocess
def test_two_loopback_nodes_share_this_machines_cores(tmp_path):
    """Issue 49: two ``shoal run --nnodes 2`` "nodes" on one machine (a loopback master: every node
    runs here) give each worker cores // (both nodes' workers), not cores // (its node's): no more
    threads than cores."""
    import subprocess

    import warm
    from shoal.launch.ports import find_free_port

    script = tmp_path / "threads.py"
    script.write_text("import os\nprint('threads', os.environ['OMP_NUM_THREADS'], flush=True)\n")
    port = str(find_free_port())
    nodes = [
        warm.popen(
            [
                sys.executable,
                "-m",
                "shoal",
                "run",
                "--nnodes",
                "2",
                "--node-rank",
                str(rank),
                "--nproc",
                "1",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                port,
                str(script),
            ],
            env=_env(tmp_path, None),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for rank in range(2)
    ]
    outputs = [node.communicate(timeout=180) for node in nodes]
    cores = len(os.sched_getaffinity(0))
    for node, (out, err) in zip(nodes, outputs):
        assert node.returncode == 0, err
        assert out.splitlines() == [f"threads {max(1, cores // 2)}"], (out, err)
        first = err.splitlines()[0]
        assert first.startswith(f"shoal run: 1 worker on this node (node {nodes.index(node)} of 2), waiting"), err
        assert first.endswith(
            f", OMP_NUM_THREADS={max(1, cores // 2)} ({cores} cores for the 2 nodes' 2 workers on this machine)"
        ), err
