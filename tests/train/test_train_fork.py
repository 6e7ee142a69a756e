"""``shoal train --nproc N`` forks its workers on CPU: safe, repeatable, same results as spawn.

Forked workers inherit the launcher as it is. GNU libgomp (torch's OpenMP on Linux) is not
fork-safe: a child whose parent ran a parallel torch operation hangs in its first parallel region.
These tests run real processes: a launcher forking workers that do multi-threaded torch work, eight
times in a row; the hazard itself and the guard ``shoal train`` puts around the launcher's
preparation; and ``shoal train`` end to end with fork and spawn.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import warm
from conftest import run_shoal
from procs import alive, children, wait_for

pytestmark = pytest.mark.multiprocess


def _run_script(path: Path, *args: str, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python path args`` in its own session; on timeout kill the whole session (hung workers
    included) and fail. It starts warm (tests/warm.py): what is looked at is what the script does
    after its imports, in a process that ran no torch operation and started no thread before them."""
    env = {**{k: v for k, v in os.environ.items() if k != "SHOAL_ENV"}, **(env or {})}
    proc = warm.popen(
        [sys.executable, str(path), *args],
        script=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{path.name} {' '.join(args)} did not finish within {timeout:.0f} s\n{stdout}\n{stderr}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


REPEATED = '''
import os, sys, time
from pathlib import Path

import torch
import torch.distributed as dist

import shoal
from shoal.launch.local import launch_local

LAUNCHER = os.getpid()


def work(scale):
    """Parallel torch work on 2 intra-op threads, then one all-reduce."""
    ctx = shoal.init(device="cpu", threads=2)
    try:
        a = torch.randn(512, 512, generator=torch.Generator().manual_seed(ctx.rank))
        for _ in range(4):
            a = torch.tanh(a @ a / 512)  # 512x512 matmuls: MKL / OpenMP on 2 threads
        total = torch.randn(300_000).abs().sum()  # an ATen parallel_for (more than one grain)
        value = torch.tensor([float(ctx.rank + 1) * scale])
        dist.all_reduce(value)
        return {"sum": value.item(), "finite": bool(torch.isfinite(a).all() and torch.isfinite(total)),
                "threads": torch.get_num_threads(), "ppid": os.getppid()}
    finally:
        ctx.shutdown()


def children():
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == LAUNCHER:
                found.append(int(entry.name))
    return found


for i in range(8):
    started = time.monotonic()
    result = launch_local(work, (i + 1,), 2, start_method="fork")
    expected = 3.0 * (i + 1)  # (rank 0 + 1 + rank 1 + 1) x scale
    assert sorted(result) == [0, 1], result
    for rank, r in result.items():
        assert r["sum"] == expected and r["finite"] and r["threads"] == 2, (i, rank, r)
        assert r["ppid"] == LAUNCHER, (i, rank, r)  # forked by this process (the elastic agent)
    print(f"launch {i + 1} ok in {time.monotonic() - started:.1f} s", flush=True)
print(f"children left: {children()}", flush=True)
'''


@pytest.mark.slow
def test_eight_fork_launches_in_a_row_with_parallel_torch_work(tmp_path):
    """The launcher forks 2 workers 8 times; each does multi-threaded torch work and an all-reduce."""
    script = tmp_path / "repeated.py"
    script.write_text(REPEATED)
    started = time.monotonic()
    result = _run_script(script, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [line.split(" ok")[0] for line in result.stdout.splitlines() if " ok in " in line] == [
        f"launch {i}" for i in range(1, 9)
    ], result.stdout
    assert "children left: []" in result.stdout, result.stdout
    assert time.monotonic() - started < 240


HAZARD = '''
import os, sys, time

import torch

from shoal.train.job import _fork_safe

mode = sys.argv[1]
torch.set_num_threads(2)
labels = bytearray(60_000)  # what torchvision's MNIST reader converts, in the launcher, on --download
if mode == "guarded":
    with _fork_safe():
        torch.frombuffer(labels, dtype=torch.uint8).long()
    assert torch.get_num_threads() == 2  # restored: what the workers inherit
else:
    torch.frombuffer(labels, dtype=torch.uint8).long()


def look(pid):
    """The main thread of ``pid``: its state, its system call and arguments, its context switches."""
    task = f"/proc/{pid}/task/{pid}"
    with open(f"{task}/stat") as f:
        state = f.read().rsplit(")", 1)[1].split()[0]
    with open(f"{task}/syscall") as f:
        call = f.read().split()
    with open(f"{task}/status") as f:
        switches = [line for line in f if "ctxt_switches" in line]
    return state, call, switches


def deadlocked(pid):
    """The child can never go on: its only thread sleeps in a private futex wait (FUTEX_WAIT or
    FUTEX_WAIT_BITSET, FUTEX_PRIVATE_FLAG) with no timeout, and did not run between two looks (the same
    context switch counts) around the one that found no other thread. Only a thread of its own could
    wake it, and there is none: libgomp waiting for the pool threads the fork left behind."""
    try:
        first = look(pid)
        threads = os.listdir(f"/proc/{pid}/task")
        second = look(pid)
    except OSError:  # gone, or /proc/PID/syscall not readable here: the deadline decides
        return False
    state, call, _ = first
    if first != second or state != "S" or threads != [str(pid)] or len(call) < 5 or call[0] != "202":
        return False
    op, timeout = int(call[2], 16), int(call[4], 16)
    return op & 0x7F in (0, 9) and op & 0x80 and timeout == 0


pid = os.fork()
if pid == 0:
    a = torch.randn(512, 512)
    for _ in range(4):
        a = torch.tanh(a @ a / 512)
    torch.randn(300_000).long().sum()
    os._exit(0)
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("child finished", os.waitstatus_to_exitcode(status), flush=True)
        break
    if deadlocked(pid):
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        print("child hung: deadlocked in a futex wait", flush=True)
        break
    time.sleep(0.05)
else:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    print("child hung: still running after", sys.argv[2], "s", flush=True)
'''


def test_fork_safe_guard_keeps_forked_children_working(tmp_path):
    """A parallel op run inside ``_fork_safe`` (as ``shoal train`` runs the workload's preparation)
    leaves no OpenMP pool behind: a forked child computes on 2 threads normally."""
    script = tmp_path / "hazard.py"
    script.write_text(HAZARD)
    result = _run_script(script, "guarded", "60", timeout=120)
    assert result.returncode == 0, result.stderr
    assert "child finished 0" in result.stdout, result.stdout + result.stderr


@pytest.mark.slow
def test_parallel_op_in_the_launcher_hangs_a_forked_child(tmp_path):
    """Why the guard exists: the same op outside it, and the forked child hangs (libgomp): ended
    once it is seen deadlocked (its only thread in a futex wait nothing can wake), else after 15 s."""
    script = tmp_path / "hazard.py"
    script.write_text(HAZARD)
    result = _run_script(script, "bare", "15", timeout=120)
    assert result.returncode == 0, result.stderr
    if "child finished" in result.stdout:
        pytest.skip("this torch's OpenMP runtime survives fork after a parallel region")
    assert "child hung" in result.stdout, result.stdout + result.stderr


PREPARE = '''
import sys

import torch

from shoal.cli.main import main
from shoal.workloads.digits import Digits


def prepare(self, cfg):
    """What `shoal train mnist --download` runs in the launcher: torchvision's label reader."""
    torch.frombuffer(bytearray(60_000), dtype=torch.uint8).long()


Digits.prepare = prepare
sys.exit(main(["train", "digits", "--nproc", "2", "--epochs", "1", "--device", "cpu", "--out", sys.argv[1]]))
'''


@pytest.mark.slow
def test_torch_work_in_prepare_does_not_hang_forked_workers(tmp_path):
    """A workload's prepare() runs torch work in the launcher (MNIST's download does): the forked
    workers, on 2 threads each, still train. Without the guard around prepare() they hang."""
    script = tmp_path / "prepare.py"
    script.write_text(PREPARE)
    torch_threads = {"OMP_NUM_THREADS": "2"}  # the launcher's pool and the workers' threads
    result = _run_script(script, str(tmp_path / "run"), timeout=180, env=torch_threads)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "workers started by fork" in result.stdout and "2 threads/process" in result.stdout, result.stdout
    assert "epoch 1/1" in result.stdout


def _train(out: Path, *extra: str, env: dict[str, str] | None = None):
    return run_shoal(
        "train", "digits", "--nproc", "2", "--epochs", "1", "--device", "cpu", "--out", str(out), *extra,
        timeout=240, env=env,
    )  # fmt: skip


DYNAMO_IMPORTED = re.compile(r"^import time:.*\|\s+torch\._dynamo\.convert_frame$", re.M)
"""A process importing ``torch._dynamo`` in ``-X importtime``'s lines (``PYTHONPROFILEIMPORTTIME=1``):
one of its modules, since the package's own line is missing when ``torch.__getattr__`` imports it
(as DDP's ``torch._dynamo.utils`` does)."""


@pytest.mark.slow
def test_shoal_train_forks_on_cpu_and_matches_spawn(tmp_path):
    """Default (auto) on CPU: fork, announced and recorded; --start-method spawn gives the same
    weights bit for bit (the forked workers inherit nothing that changes the run). torch._dynamo,
    which every worker's first step imports, is imported once by the launcher for forked workers,
    and by each spawned one."""
    importtime = {"PYTHONPROFILEIMPORTTIME": "1"}
    forked = _train(tmp_path / "fork", env=importtime)
    assert forked.returncode == 0, forked.stderr + forked.stdout
    assert "workers started by fork" in forked.stdout
    spawned = _train(tmp_path / "spawn", "--start-method", "spawn", env=importtime)
    assert spawned.returncode == 0, spawned.stderr + spawned.stdout
    assert "workers started by spawn" in spawned.stdout
    assert len(DYNAMO_IMPORTED.findall(forked.stderr)) == 1, forked.stderr[-3000:]
    assert len(DYNAMO_IMPORTED.findall(spawned.stderr)) == 2, spawned.stderr[-3000:]
    for name, result in (("fork", forked), ("spawn", spawned)):
        out = tmp_path / name
        config = json.loads((out / "config.json").read_text())
        assert config["launch"]["start_method"] == ("auto" if name == "fork" else "spawn")
        assert config["extra"]["start_method"] == name
        metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert len(metrics) == 1 and metrics[0]["test_accuracy"] > 0.5
        # Rank 0 alone prints, once each: nothing buffered in the launcher came out per worker.
        assert result.stdout.count("shoal train digits:") == 1, result.stdout
        assert result.stdout.count("epoch 1/1") == 1, result.stdout
    a = torch.load(tmp_path / "fork" / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "spawn" / "model.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_bad_start_method_is_one_line_with_hint(tmp_path):
    out = tmp_path / "out"
    result = run_shoal("train", "digits", "--nproc", "2", "--start-method", "bogus", "--out", str(out), timeout=60)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [
        "shoal: error: --start-method 'bogus' is not one of: auto, fork, spawn",
        "HINT: choose one of: auto, fork, spawn",
    ], result.stderr
    assert not out.exists()


SIGNALS = '''
import ctypes, os, signal, tempfile

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from shoal.launch.local import launch_local

LAUNCHER = os.getpid()
NAMES = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


def handlers():
    def describe(handler):
        return handler.name if isinstance(handler, signal.Handlers) else getattr(handler, "__name__", repr(handler))

    return {name: describe(signal.getsignal(getattr(signal, name))) for name in NAMES}


def probe():
    """Stands in for training: what shoal's launch core left this forked worker with."""
    sig = ctypes.c_int(0)
    ctypes.CDLL(None, use_errno=True).prctl(2, ctypes.byref(sig))  # 2 = PR_GET_PDEATHSIG
    return {"handlers": handlers(), "pdeathsig": sig.value, "parent_is_launcher": os.getppid() == LAUNCHER}


def raw():
    return {"handlers": handlers()}


# torch's agent alone, forking: the hazard shoal's core removes.
config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0",
                      run_id="raw", max_restarts=0, start_method="fork",
                      logs_specs=DefaultLogsSpecs(log_dir=tempfile.mkdtemp()))
print("raw", elastic_launch(config, raw)()[0]["handlers"], flush=True)
print("worker", launch_local(probe, (), 2, start_method="fork"), flush=True)
'''


def test_forked_worker_gets_default_signal_handlers_and_dies_with_launcher(tmp_path):
    """A forked worker inherits the elastic agent's handlers (they raise SignalException); the
    training entry point resets them to what a spawned worker has, and sets PR_SET_PDEATHSIG
    towards the launcher, its parent as with spawn."""
    script = tmp_path / "signals.py"
    script.write_text(SIGNALS)
    result = _run_script(script, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if line.startswith(("raw ", "worker ")))
    raw = eval(lines["raw"])
    assert raw["SIGTERM"] == "_terminate_process_handler", raw  # the hazard: inherited from the agent
    workers = eval(lines["worker"])
    assert sorted(workers) == [0, 1]
    for rank, seen in workers.items():
        assert seen["handlers"] == {
            "SIGTERM": "SIG_DFL",
            "SIGINT": "default_int_handler",
            "SIGHUP": "SIG_DFL",
            "SIGQUIT": "SIG_DFL",
        }, (rank, seen)
        assert seen["pdeathsig"] == signal.SIGKILL and seen["parent_is_launcher"], (rank, seen)


@pytest.mark.slow
def test_forked_workers_die_with_a_killed_launcher(tmp_path):
    """kill -9 of the ``shoal train`` launcher: its forked workers go too (end to end; torch's own
    PR_SET_PDEATHSIG to SIGINT would also end them while they run Python code, shoal's SIGKILL,
    checked above, also when they are stuck in C)."""
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "SHOAL_ENV"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shoal",
            "train",
            "digits",
            "--nproc",
            "2",
            "--epochs",
            "500",
            "--device",
            "cpu",
            "--checkpoint-every",
            "0",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
    )
    try:
        wait_for(
            lambda: (out / "metrics.jsonl").exists(), 180, 0.1, "training under way",
            unless=lambda: proc.poll() is not None, details=lambda: str(proc.poll() is not None and proc.communicate()),
        )  # fmt: skip
        workers = children(proc.pid)
        launcher_cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert len(workers) == 2, workers
        assert all(Path(f"/proc/{pid}/cmdline").read_bytes() == launcher_cmdline for pid in workers)  # forked
        os.kill(proc.pid, signal.SIGKILL)  # the launcher alone
        proc.communicate(timeout=30)
        wait_for(lambda: not any(alive(pid) for pid in workers), 30, 0.1, f"workers {workers} gone with their launcher")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if proc.poll() is None:
            proc.communicate()
