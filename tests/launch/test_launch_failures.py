"""Traceback extraction and ChildFailedError reports, on real ProcessFailure objects and log files."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from cgroups import memory_cgroup as limited_cgroup
from cgroups import run_in_cgroup
from shoal.launch.failures import (
    describe_child_failure,
    exception_line,
    extract_last_traceback,
    find_stderr_log,
)

TB = """\
Traceback (most recent call last):
  File "/x/train.py", line 25, in <module>
    check(rank)
  File "/x/train.py", line 22, in check
    raise ValueError(f"boom at rank {rank}")
    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
ValueError: boom at rank 1"""


def test_plain_traceback_between_other_output():
    text = "loading data\nepoch 1 loss 0.3\n" + TB + "\n"
    assert extract_last_traceback(text) == TB
    assert exception_line(TB) == "ValueError: boom at rank 1"


def test_no_traceback():
    assert extract_last_traceback("") is None
    assert extract_last_traceback("epoch 1\nSegmentation fault\n") is None


def test_last_of_several_and_trailing_log_lines_dropped():
    first = TB.replace("boom", "earlier")
    text = (
        first + "\nretrying\n" + TB + "\n"
        "[rank1]:[W1122 01:13:06.964 ProcessGroupGloo.cpp:1] Warning: destroy_process_group() was not called\n"
        "W1122 01:13:06.964000 5465 torch/distributed/run.py:982] something else\n"
    )
    assert extract_last_traceback(text) == TB


def test_prefixed_lines_of_one_rank_among_others():
    # torch prefixes a worker's uncaught traceback with "[rankN]: "; torchrun's tee adds
    # "[default1]:"; another rank's lines may be interleaved.
    lines = []
    for i, line in enumerate(TB.splitlines()):
        lines.append(f"[default1]:[rank1]: {line}")
        lines.append(f"[default0]:[rank0]: still training, step {i}")
    got = extract_last_traceback("\n".join(lines))
    assert got == TB


def test_multi_line_message_kept():
    tb = TB.replace(
        "ValueError: boom at rank 1",
        'RuntimeError: Error(s) in loading state_dict for Net:\n\tMissing key(s): "fc.weight".',
    )
    assert extract_last_traceback(tb + "\n\nbye\n") == tb
    assert exception_line(tb) == "RuntimeError: Error(s) in loading state_dict for Net:"


def test_exception_chain_kept_whole():
    chain = (
        TB
        + "\n\nDuring handling of the above exception, another exception occurred:\n\n"
        + TB.replace("ValueError: boom at rank 1", "KeyError: 'lr'")
    )
    assert extract_last_traceback("noise\n" + chain + "\n") == chain
    assert exception_line(chain) == "KeyError: 'lr'"


# --- reports from ChildFailedError -------------------------------------------------------


def _log(tmp_path, local_rank: int, text: str, mtime: float | None = None) -> str:
    d = tmp_path / "run_abc" / "attempt_0" / str(local_rank)
    d.mkdir(parents=True, exist_ok=True)
    path = d / "stderr.log"
    path.write_text(text)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return str(path)


def _failure(local_rank: int, exitcode: int, error_file: str = "/nonexistent/error.json"):
    return ProcessFailure(local_rank=local_rank, pid=1000 + local_rank, exitcode=exitcode, error_file=error_file)


def test_root_cause_from_stderr_logs_not_the_consequence(tmp_path):
    now = time.time()
    _log(tmp_path, 0, 'Traceback (most recent call last):\n  File "x"\nRuntimeError: Connection closed by peer\n', now)
    _log(tmp_path, 1, "step 1\n" + TB + "\n", now - 0.05)  # rank 1 wrote its traceback first
    err = ChildFailedError("train.py", {0: _failure(0, 1), 1: _failure(1, 1)})
    report = describe_child_failure(err, str(tmp_path))
    assert (report.rank, report.local_rank, report.exit_code) == (1, 1, 1)
    assert report.traceback == TB
    assert report.message == "ValueError: boom at rank 1"
    assert report.other_ranks == [0]
    assert report.raised  # its own exception: a retry would raise it again (a Flyte user error)
    text = report.format()
    assert text.splitlines()[0] == "shoal: rank 1 (local rank 1) failed with exit code 1; its traceback:"
    assert TB in text
    assert text.splitlines()[-2:] == [
        "shoal: rank 0 stopped because rank 1 failed",
        "shoal: error: rank 1 failed: ValueError: boom at rank 1",
    ]
    assert str(tmp_path) not in text  # logs are not kept: don't point at them


def test_ranks_stopped_by_the_agent_are_not_the_root_cause(tmp_path):
    paths = {0: _log(tmp_path, 0, "", time.time() - 10), 1: _log(tmp_path, 1, TB + "\n")}
    # The agent's SIGTERM to a worker that was idle (its log untouched for long) comes last.
    err = ChildFailedError("train.py", {1: _failure(1, 1), 0: _failure(0, -signal.SIGTERM)})
    report = describe_child_failure(err, stderr_logs=paths, keep_logs=True)
    assert report.rank == 1 and report.other_ranks == [0]
    assert "shoal: rank 0 stopped because rank 1 failed" in report.format().splitlines()
    assert "shoal: worker logs: " + str(tmp_path / "run_abc" / "attempt_0") in report.format()


def test_killed_by_signal(tmp_path):
    _log(tmp_path, 0, "epoch 1\nepoch 2\n")
    err = ChildFailedError("train.py", {3: _failure(0, -signal.SIGKILL)})
    report = describe_child_failure(err, str(tmp_path))
    assert report.exit_code == 128 + 9 and report.signal_name == "SIGKILL" and not report.raised
    text = report.format()
    assert "rank 3 (local rank 0) was killed by SIGKILL (9); the last lines of its stderr:" in text
    assert "epoch 2" in text
    assert "out-of-memory" in text.splitlines()[-1]


def test_abort_at_exit_gets_a_hint(tmp_path):
    # What torch 2.14 prints when gloo's threads outlive the interpreter (see collectives.destroy_process_group).
    _log(tmp_path, 0, "epoch 3/3 done\nterminate called without an active exception\n")
    report = describe_child_failure(ChildFailedError("train.py", {0: _failure(0, -signal.SIGABRT)}), str(tmp_path))
    assert report.exit_code == 128 + 6
    lines = report.format().splitlines()
    assert lines[-2] == "shoal: error: rank 0 failed: killed by SIGABRT"
    assert lines[-1].startswith("HINT: the worker aborted while exiting") and "gc.collect()" in lines[-1]


def test_other_aborts_get_no_hint(tmp_path):
    _log(tmp_path, 0, "epoch 1\nfree(): invalid pointer\n")
    report = describe_child_failure(ChildFailedError("train.py", {0: _failure(0, -signal.SIGABRT)}), str(tmp_path))
    assert report.hint is None and "HINT" not in report.format()


def test_no_logs_at_all():
    err = ChildFailedError("train.py", {0: _failure(0, 3)})
    text = describe_child_failure(err).format()
    assert text.splitlines() == [
        "shoal: rank 0 (local rank 0) failed with exit code 3; it left no traceback.",
        "shoal: error: rank 0 failed: exit code 3",
    ]
    assert describe_child_failure(err).exit_code == 3 and describe_child_failure(err).raised


def test_a_rank_that_lost_its_peer_did_not_raise_of_its_own(tmp_path):
    # What a retry can fix (a Flyte recoverable error): the collective failed because a peer is gone.
    _log(tmp_path, 0, 'Traceback (most recent call last):\n  File "x"\nRuntimeError: Connection reset by peer\n')
    report = describe_child_failure(ChildFailedError("train.py", {0: _failure(0, 1)}), str(tmp_path))
    assert report.exit_code == 1 and report.message == "RuntimeError: Connection reset by peer"
    assert not report.raised


def test_error_file_of_a_function_entrypoint(tmp_path):
    # What torch's @record (and every function entrypoint) writes: no stderr log needed.
    error_file = tmp_path / "error.json"
    error_file.write_text(
        json.dumps(
            {
                "message": {
                    "message": "ValueError: boom at rank 1",
                    "extraInfo": {"py_callstack": TB + "\n", "timestamp": str(int(time.time()))},
                }
            }
        )
    )
    err = ChildFailedError("train_fn", {1: _failure(1, 1, str(error_file))})
    report = describe_child_failure(err)
    assert report.traceback == TB and report.message == "ValueError: boom at rank 1"


def test_find_stderr_log_picks_the_newest(tmp_path):
    old = _log(tmp_path, 1, "old", time.time() - 100)
    newer_dir = tmp_path / "run_def" / "attempt_2" / "1"
    newer_dir.mkdir(parents=True)
    (newer_dir / "stderr.log").write_text("new")
    assert find_stderr_log(str(tmp_path), 1) == str(newer_dir / "stderr.log") != old
    assert find_stderr_log(str(tmp_path), 7) is None


@pytest.mark.parametrize("code,expected", [(1, 1), (2, 2), (-15, 143), (-11, 139)])
def test_exit_codes(code, expected):
    err = ChildFailedError("x", {0: _failure(0, code)})
    assert describe_child_failure(err).exit_code == expected


# --- a worker killed by SIGKILL: the out-of-memory killer, or someone else ----------------------

MEMORY_LIMIT = 1536 << 20
"""For the launcher (torch imported: a few hundred MiB) and its two workers."""
WORKER = """\
import os, signal, sys, time
if os.environ["RANK"] != "1":
    time.sleep(300)  # the agent stops this rank once rank 1 is gone
    sys.exit(0)
print("rank 1: starting", flush=True)
if sys.argv[1] == "oom":
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")  # be the OOM killer's victim, not the launcher
    chunks = []
    for _ in range(200):  # 64 MiB at a time, written (so resident), far beyond the cgroup's limit
        chunks.append(b"x" * (64 << 20))
    print("rank 1: the memory limit never came", flush=True)
else:
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.fixture
def memory_cgroup():
    """A fresh child of this process's memory cgroup limited to MEMORY_LIMIT (v1 or v2); removed afterwards."""
    with limited_cgroup(MEMORY_LIMIT, "test") as child:
        yield child


def _run_in_cgroup(cgroup: str, tmp_path, mode: str) -> subprocess.CompletedProcess:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    # The launcher joins the cgroup before it starts: its workers are born there.
    return run_in_cgroup(cgroup, [sys.executable, "-m", "shoal", "run", "--nproc", "2", str(script), mode], timeout=240)


@pytest.mark.multiprocess
def test_a_real_oom_kill_is_named_with_rank_host_and_cgroup(memory_cgroup, tmp_path):
    proc = _run_in_cgroup(memory_cgroup, tmp_path, "oom")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 128 + signal.SIGKILL, out
    assert "the memory limit never came" not in out
    cgroup = "/" + os.path.relpath(memory_cgroup, "/sys/fs/cgroup").split("/", 1)[-1]
    summary = next(line for line in out.splitlines() if line.startswith("shoal: error:"))
    assert summary.startswith(
        f"shoal: error: rank 1 failed: killed by SIGKILL on {socket.gethostname()}: the kernel's out-of-memory killer ("
    ), out
    assert f"OOM kills in memory cgroup {cgroup} (limit 1.50 GiB): 0 -> 1" in summary, out
    if os.access("/dev/kmsg", os.R_OK):  # the kernel's own record of this very process
        assert re.search(r"kernel: .*Killed process \d+ \(python", summary), summary
    assert out.splitlines()[-1].startswith(
        "HINT: the node ran out of memory (1.50 GiB for the launcher and its workers): lower the batch size"
    ), out


@pytest.mark.multiprocess
def test_a_plain_sigkill_is_not_called_an_oom_kill(memory_cgroup, tmp_path):
    proc = _run_in_cgroup(memory_cgroup, tmp_path, "kill")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 128 + signal.SIGKILL, out
    assert "rank 1 (local rank 1) was killed by SIGKILL (9)" in out
    last = out.splitlines()[-1]
    assert last.startswith(
        f"shoal: error: rank 1 failed: killed by SIGKILL on {socket.gethostname()}, not by the out-of-memory killer "
        "(OOM kills in memory cgroup "
    ), out
    assert ": still 0): something else sent it (`kill -9`, a scheduler" in last


def _error_file(path, message: str, traceback: str, mtime: float) -> str:
    """An error file as a worker's uncaught exception writes it (torch's @record format)."""
    path.write_text(
        json.dumps({"message": {"message": message, "extraInfo": {"py_callstack": traceback, "timestamp": "0"}}})
    )
    os.utime(path, (mtime, mtime))
    return str(path)


def test_the_first_error_file_is_the_cause_even_when_its_rank_was_stopped_after(tmp_path):
    # Rank 1 raised (its error file written first) and was still exiting when rank 0 failed of the
    # broken connection: the agent then stopped rank 1 with SIGTERM. Rank 1 is still the cause.
    now = time.time()
    collateral = TB.replace("ValueError: boom at rank 1", "RuntimeError: Connection closed by peer")
    first = _error_file(tmp_path / "e1.json", "ValueError: boom at rank 1", TB, now - 0.2)
    second = _error_file(tmp_path / "e0.json", "RuntimeError: Connection closed by peer", collateral, now)
    err = ChildFailedError("train.py", {0: _failure(0, 1, second), 1: _failure(1, -signal.SIGTERM, first)})
    report = describe_child_failure(err)
    lines = report.format().splitlines()
    assert report.exit_code == 1  # the exception's status, not the SIGTERM that caught it exiting
    assert lines[0] == "shoal: rank 1 (local rank 1) failed with exit code 1; its traceback:"
    assert lines[1:-2] == TB.splitlines()
    assert lines[-2:] == [
        "shoal: rank 0 stopped because rank 1 failed",
        "shoal: error: rank 1 failed: ValueError: boom at rank 1",
    ]


NCCL_TB = """\
Traceback (most recent call last):
  File "/x/ddp.py", line 3, in <module>
    dist.init_process_group("nccl")
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83, in wrapper
    return func(*args, **kwargs)
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 714, in _create_nccl
    backend_class = ProcessGroupNCCL(
ValueError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!"""


def test_a_known_cause_is_one_line_where_in_the_users_code_and_its_hint(tmp_path):
    """Issue 49: where shoal knows the cause, no traceback through torch's frames: the ranks, the
    user's line that called it, the exception, the HINT."""
    message = "ValueError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!"
    now = time.time()
    files = {rank: _error_file(tmp_path / f"e{rank}.json", message, NCCL_TB, now + rank / 10) for rank in range(3)}
    err = ChildFailedError("ddp.py", {rank: _failure(rank, 1, path) for rank, path in files.items()})
    assert describe_child_failure(err).format().splitlines() == [
        f"shoal: error: ranks 0, 1, 2 failed at /x/ddp.py, line 3: {message}",
        'HINT: the nccl backend needs GPUs and this machine has none: use init_process_group("gloo") on CPU, '
        "or shoal.init(), which picks the backend for the device",
    ]


def test_ranks_that_failed_alike_are_one_line(tmp_path):
    tb = TB.replace("boom at rank 1", "boom")
    now = time.time()
    files = {
        rank: _error_file(tmp_path / f"e{rank}.json", "ValueError: boom", tb, now + rank / 10) for rank in range(3)
    }
    err = ChildFailedError("ddp.py", {rank: _failure(rank, 1, path) for rank, path in files.items()})
    lines = describe_child_failure(err).format().splitlines()
    assert lines[0] == "shoal: rank 0 (local rank 0) failed with exit code 1; its traceback:"
    assert lines[1:-2] == tb.splitlines()
    assert lines[-2:] == ["shoal: ranks 1, 2 failed the same way", "shoal: error: rank 0 failed: ValueError: boom"]
