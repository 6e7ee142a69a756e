"""``shoal.run(fn, *args, nproc=N)``: a user's function on N real workers (gloo on CPU).

The cases run a small driver script in a process of its own, not in pytest (a launcher forked from
pytest would inherit whatever torch thread pool earlier tests started). Four cases run one after
another in one driver process, each with its own marks, its own output and the exit status the
driver gives its ShoalError; the one that runs parallel torch work in its driver runs at the same
time in a second driver; the others, each in a driver process of their own.
Every call of ``fn`` leaves a mark file named after its rank and process id, so the tests see which
processes ran it and how often.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import shoal
import warm
from conftest import shoal_cmd
from procs import alive
from tracking.harness import free_port

pytestmark = pytest.mark.multiprocess

DRIVER = '''
import json, os, sys

import torch
import torch.distributed as dist

import shoal


def marks():
    """This case's marks directory: set by the driver before each case, inherited by its workers."""
    return os.environ["DRIVER_MARKS"]


def probe(tag, *, scale=1):
    """Sum of (rank + 1) over the group, times scale; leaves a mark."""
    rank = dist.get_rank()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    open(os.path.join(marks(), f"ran-{rank}-{os.getpid()}"), "w").close()
    return {"rank": rank, "world": dist.get_world_size(), "sum": total.item() * scale, "tag": tag}


def fail_on_rank_1():
    open(os.path.join(marks(), f"ran-{dist.get_rank()}-{os.getpid()}"), "w").close()
    if dist.get_rank() == 1:
        raise ValueError("boom on rank 1")
    dist.barrier()


def main(mode):
    if mode == "value":
        result = shoal.run(probe, "a", kwargs={"scale": 10}, nproc=2, threads=2)  # the fork probe runs, passes
    elif mode == "spawn-all":
        result = shoal.run(probe, "b", nproc=2, start_method="spawn", all_ranks=True)
    elif mode == "fail":
        result = shoal.run(fail_on_rank_1, nproc=2)
    elif mode == "lambda":
        result = shoal.run(lambda: 1, nproc=2, start_method="spawn")
    elif mode == "threads-used":  # a notebook that ran a model first: GNU OpenMP's pool exists here
        torch.set_num_threads(2)
        torch.ones(1 << 20).exp_()
        result = shoal.run(probe, "t", nproc=2, threads=2)
    elif mode == "node":  # one node of two, on this machine: node rank and port in argv
        node_rank, port = int(sys.argv[3]), int(sys.argv[4])
        result = shoal.run(probe, "n", nnodes=2, node_rank=node_rank, master_addr="127.0.0.1", master_port=port)
    elif mode == "outer":  # started as one rank of a job: fn runs here, no workers of its own
        result = shoal.run(probe, "d", nproc=2)
        result["pid"] = os.getpid()
        # in a file, not on stdout: the two ranks share the launcher's stdout, and lines can interleave
        with open(os.path.join(sys.argv[2], f"result-{result['rank']}.json"), "w") as out:
            json.dump(result, out)
        return
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    # argv: the cases (comma-separated, run in order), then the directory of their marks
    print(f"DRIVER {os.getpid()}", flush=True)
    for mode in sys.argv[1].split(","):
        os.environ["DRIVER_MARKS"] = os.path.join(sys.argv[2], mode)
        os.makedirs(os.environ["DRIVER_MARKS"], exist_ok=True)  # exists: the other rank of an outer job made it
        print(f"CASE {mode}", flush=True)
        print(f"CASE {mode}", file=sys.stderr, flush=True)
        code = 0
        try:
            main(mode)
        except shoal.ShoalError as err:
            print(err.format(), file=sys.stderr, flush=True)
            code = err.exit_code
        print(f"EXIT {mode} {code}", flush=True)
    sys.exit(code)
'''


def _environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "SHOAL_ENV"}


def _start(cmd: list[str]):
    """``cmd`` started in its own session (see :func:`_finish`); a driver script starts warm (what is
    looked at is what its shoal.run does, not its own start-up: tests/warm.py)."""
    return warm.popen(
        cmd, script=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env=_environ(),
    )  # fmt: skip


def _run(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return _finish(_start(cmd), timeout)


def _finish(proc, timeout: float) -> subprocess.CompletedProcess:
    """``proc`` waited for; on a timeout its whole group is killed (hung workers included)."""
    cmd = proc.args
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not finish within {timeout:.0f} s\n{stdout}\n{stderr}")
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def _results(stdout: str) -> list:
    return [json.loads(line[len("RESULT ") :]) for line in stdout.splitlines() if line.startswith("RESULT ")]


def _ran(marks: Path) -> list[tuple[int, int]]:
    """The marks of one case as (rank, pid) pairs."""
    return sorted((int(rank), int(pid)) for _, rank, pid in (p.name.split("-") for p in marks.iterdir()))


def _driver(directory: Path) -> tuple[Path, Path]:
    """The driver script written into ``directory``, and the directory of its cases' marks."""
    script = directory / "driver.py"
    script.write_text(DRIVER)
    marks = directory / "marks"
    marks.mkdir()
    return script, marks


@pytest.fixture
def driver(tmp_path):
    """``driver(mode)``: one case in a driver process of its own: (process, its RESULT values, the
    marks as (rank, pid) pairs)."""
    script, marks = _driver(tmp_path)

    def run(mode: str, *, launcher: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, list, list]:
        proc = _run([*launcher, *([] if launcher else [sys.executable]), str(script), mode, str(marks)])
        return proc, _results(proc.stdout), _ran(marks / mode)

    return run


def _case_lines(text: str) -> dict[str, list[str]]:
    """``text``'s lines by the case they follow (``CASE name``); those before the first, under ''."""
    cases: dict[str, list[str]] = {"": []}
    lines = cases[""]
    for line in text.splitlines(keepends=True):
        if line.startswith("CASE "):
            lines = cases.setdefault(line[len("CASE ") :].strip(), [])
        else:
            lines.append(line)
    return cases


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, list, list]]:
    """The cases below in two driver processes started together (threads-used alone; the others one
    after another, in this order, in the second); each case's (its output as a process
    of its own: the driver's first line, then what was written during the case, and the exit code
    the driver would have exited with; its RESULT values; its marks as (rank, pid) pairs)."""
    script, marks = _driver(tmp_path_factory.mktemp("cases"))
    # threads-used in a driver of its own, beside the others: its parallel torch work stays out of
    # their process, and its fork probe's 10 s wait for the hung child overlaps their work.
    groups = [("threads-used",), ("value", "spawn-all", "lambda", "fail")]
    started = {modes: _start([sys.executable, str(script), ",".join(modes), str(marks)]) for modes in groups}
    found = {}
    for modes, running in started.items():  # each prints a few KB at most: a pipe holds it until read
        proc = _finish(running, timeout=240)
        out, err = _case_lines(proc.stdout), _case_lines(proc.stderr)
        for mode in modes:
            exits = [line for line in out.get(mode, []) if line.startswith(f"EXIT {mode} ")]
            assert len(exits) == 1, f"case {mode} did not end\n{proc.stdout}\n{proc.stderr}"
            stdout = "".join(out[""] + [line for line in out[mode] if line not in exits])
            code = int(exits[0].split()[2])
            found[mode] = (
                subprocess.CompletedProcess(proc.args, code, stdout, "".join(err[""] + err[mode])),
                _results(stdout),
                _ran(marks / mode),
            )
    return found


def test_fn_on_two_workers_returns_rank_0s_value_with_a_working_group(cases):
    proc, results, ran = cases["value"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # rank 0's value; the all_reduce summed 1 + 2 across the two workers; args and kwargs arrived
    assert results == [{"rank": 0, "world": 2, "sum": 30.0, "tag": "a"}]
    assert [rank for rank, _ in ran] == [0, 1]  # fn ran once on each rank...
    driver_pid = int(proc.stdout.split("DRIVER ")[1].split()[0])
    assert driver_pid not in {pid for _, pid in ran} and len({pid for _, pid in ran}) == 2  # ...in two workers


def test_spawned_workers_run_a_module_level_function_and_all_ranks_gives_every_value(cases):
    proc, results, ran = cases["spawn-all"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert results == [[{"rank": r, "world": 2, "sum": 3.0, "tag": "b"} for r in (0, 1)]]  # in rank order
    assert [rank for rank, _ in ran] == [0, 1]


def test_a_failing_rank_is_named_with_its_traceback_and_no_worker_survives(cases):
    proc, results, ran = cases["fail"]
    assert proc.returncode != 0 and not results
    report = proc.stderr
    assert "shoal: rank 1 (local rank 1) failed with exit code 1; its traceback:" in report, report
    assert 'raise ValueError("boom on rank 1")' in report and "in fail_on_rank_1" in report  # the user's frame
    assert report.rstrip().splitlines()[-1].startswith("shoal: error: rank 1 failed: ValueError: boom on rank 1")
    assert [rank for rank, _ in ran] == [0, 1]
    assert not [pid for _, pid in ran if alive(pid)]  # both workers are gone, the victim too


def test_a_lambda_cannot_be_spawned_one_line_and_a_hint_before_any_worker(cases):
    proc, results, ran = cases["lambda"]
    assert proc.returncode != 0 and not results and not ran
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("shoal: error: shoal.run cannot spawn workers for main.<locals>.<lambda>: ")
    assert "it cannot be pickled" in lines[0]
    assert lines[1].startswith("HINT: define the function at the top level of a .py module")
    assert len(lines) == 2 and "Traceback" not in proc.stderr
    assert "workers started" not in proc.stdout + proc.stderr


def test_forking_after_parallel_torch_work_is_refused_in_one_line_instead_of_hanging(cases):
    proc, results, ran = cases["threads-used"]
    assert proc.returncode != 0 and not results and not ran  # no worker started
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("shoal: error: shoal.run cannot fork workers with 2 threads each: this process")
    assert lines[1].startswith("HINT: call shoal.run before any torch computation") and len(lines) == 2


def test_a_function_typed_into_a_repl_runs_on_forked_workers_and_is_refused_for_spawn():
    code = (
        "import shoal, torch.distributed as dist\n"
        "def world():\n    return dist.get_world_size()\n"
        "try:\n    shoal.run(world, nproc=2, start_method='spawn')\n"
        "except shoal.ShoalError as err:\n    print(err.format())\n"
        "print('WORLD', shoal.run(lambda: (dist.get_rank(), dist.get_world_size()), nproc=2))\n"
    )
    proc = _run([sys.executable, "-c", code])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "shoal.run cannot spawn workers for world: it was defined in a notebook or REPL" in proc.stdout
    assert "WORLD (0, 2)" in proc.stdout  # fork (CPU's default) runs even a lambda


def test_as_one_node_of_two_the_node_with_rank_0_gets_its_value_and_the_other_none(tmp_path):
    script, marks = _driver(tmp_path)
    port = free_port()
    nodes = [
        subprocess.Popen(
            [sys.executable, str(script), "node", str(marks), str(rank), str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env=_environ(),
        )  # fmt: skip
        for rank in (0, 1)
    ]
    try:
        outputs = [node.communicate(timeout=120) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    for node, (stdout, stderr) in zip(nodes, outputs):
        assert node.returncode == 0, stdout + stderr
    results = [
        [line[len("RESULT ") :] for line in stdout.splitlines() if line.startswith("RESULT ")] for stdout, _ in outputs
    ]
    assert results == [['{"rank": 0, "world": 2, "sum": 3.0, "tag": "n"}'], ["null"]]
    assert sorted(int(p.name.split("-")[1]) for p in (marks / "node").iterdir()) == [0, 1]  # one worker per node


def test_as_one_rank_of_an_outer_job_fn_runs_here_once_per_rank(driver, tmp_path):
    proc, _, ran = driver("outer", launcher=tuple(shoal_cmd("run", "--nproc", "2")))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = [json.loads(path.read_text()) for path in sorted((tmp_path / "marks").glob("result-*.json"))]
    assert sorted((r["rank"], r["world"], r["sum"]) for r in results) == [(0, 2, 3.0), (1, 2, 3.0)]
    # fn ran once per rank, in the rank's own process: no workers of workers
    assert ran == sorted((r["rank"], r["pid"]) for r in results)
    # the script's nproc=2 agrees with the launcher's 2 workers: the same job, nothing to say
    # (placement(): options that disagree are refused, tests/env/test_env_operator.py)
    assert "shoal.run" not in proc.stderr, proc.stderr


def test_an_unknown_option_is_one_line_naming_it():
    with pytest.raises(shoal.ShoalError) as caught:
        shoal.run(print, nproc=2, epochs=3)
    assert caught.value.message == "shoal.run got unknown option(s): epochs"
    assert "kwargs={...}" in caught.value.hint
