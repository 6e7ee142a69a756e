"""``--cpu-profile=DIR``: where the suite's CPU goes, per test and per file.

The suite is CPU-bound on 2 cores (docs/TEST_TIME.md), so its wall time follows the CPU its tests
spend, nearly all of it in the processes they start. For each test this records the wall time, the
CPU of the pytest process, the CPU of its waited-for descendants (``RUSAGE_CHILDREN``: every
launcher, worker, daemon and pod process once reaped, forked workers included, and the commands
started warm by tests/warm.py), when it started, and why each command that could have started warm
started fresh into ``DIR/tests-<worker>.jsonl``, one JSON object a line; each worker adds its warm
servers' own CPU at its end (``DIR/servers-<worker>.json``). At the end the run prints the files that
cost the most, the fresh starts by file and by reason, each worker's first start, last end and time
between tests, the warm servers' CPU, and writes ``DIR/file_seconds.json`` (the seconds
of each file that ran: after a full run, copy it to tests/, where it sets the order tests/conftest.py
hands the files out in). Records of an earlier run in DIR are removed first. A module fixture's
processes count in the first test that uses it; a process nobody waits for (a daemon left to init)
counts nowhere.

    make test PYTEST_ARGS="-n 3 --dist loadgroup --no-loadscope-reorder --cpu-profile=/tmp/cpu"

With ``=``: tests/conftest.py defines the option, and before it is read pytest takes a separate
value that names an existing directory for a path to test (xdist's workers, started once the
directory exists, then find no conftest and no such option).
"""

from __future__ import annotations

import collections
import json
import os
import resource
import time
from pathlib import Path

import pytest

import warm

TOP_FILES = 25
TOP_FRESH = 8
SESSION_START = pytest.StashKey[float]()
"""When this process's session began (the controller's is what pytest's own "in N s" counts from)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-profile",
        metavar="DIR",
        default=None,
        help="(as --cpu-profile=DIR) record each test's wall time and CPU (its own and its child processes') in DIR; "
        "print the costliest files at the end",
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    """DIR made once per process; the controller clears an earlier run's records (it starts before
    any xdist worker writes)."""
    directory = session.config.getoption("cpu_profile")
    if not directory:
        return
    session.config.stash[SESSION_START] = time.time()
    Path(directory).mkdir(parents=True, exist_ok=True)
    if not hasattr(session.config, "workerinput"):
        for old in [*Path(directory).glob("tests-*.jsonl"), *Path(directory).glob("servers-*.json")]:
            old.unlink()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Each process that ran tests: its warm servers' own CPU, which no test's figure holds."""
    directory = session.config.getoption("cpu_profile")
    if not directory:
        return
    count, seconds = warm.servers_cpu_s()
    if not count:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    summary = {"servers": count, "cpu_s": round(seconds, 1), "pids": warm.server_pids()}
    (Path(directory) / f"servers-{worker}.json").write_text(json.dumps(summary))


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    warm_children = warm.children_cpu_s() if who == resource.RUSAGE_CHILDREN else 0.0  # the warm server's
    return usage.ru_utime + usage.ru_stime + warm_children


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    directory = item.config.getoption("cpu_profile")
    if not directory:
        return (yield)
    own, children = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    start, began = time.monotonic(), time.time()
    fresh_before, warm_before = len(warm.fresh_starts), len(warm.warm_starts)
    try:
        return (yield)
    finally:
        record = {
            "test": item.nodeid,
            "start": round(began, 3),
            "wall_s": round(time.monotonic() - start, 3),
            "cpu_s": round(_cpu(resource.RUSAGE_SELF) - own, 3),
            "children_cpu_s": round(_cpu(resource.RUSAGE_CHILDREN) - children, 3),
            "fresh_starts": warm.fresh_starts[fresh_before:],
            "pid": os.getpid(),  # the process its processes descend from (tests/process_census.py)
            "warm_pids": warm.warm_starts[warm_before:],  # and those a warm server forked for it
        }
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(Path(directory) / f"tests-{worker}.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")


def read_profile(directory: str | os.PathLike) -> tuple[list[dict], list[dict]]:
    """What a run wrote in ``directory``: each test's record (with its ``worker``), and each worker's
    servers (``servers``, ``cpu_s``, ``pids``; tests/process_census.py reads both)."""
    records = [
        {**json.loads(line), "worker": path.stem.removeprefix("tests-")}
        for path in sorted(Path(directory).glob("tests-*.jsonl"))
        for line in path.open()
    ]
    servers = [json.loads(path.read_text()) for path in sorted(Path(directory).glob("servers-*.json"))]
    return records, servers


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    directory = config.getoption("cpu_profile")
    if not directory or hasattr(config, "workerinput"):  # the summary once, from the controller
        return
    records, servers = read_profile(directory)
    if not records:
        return
    wall, cpu, count = collections.Counter(), collections.Counter(), collections.Counter()
    fresh_by_file, fresh_why = collections.Counter(), collections.Counter()
    for record in records:
        name = record["test"].split("::")[0]
        wall[name] += record["wall_s"]
        cpu[name] += record["cpu_s"] + record["children_cpu_s"]
        count[name] += 1
        fresh_by_file[name] += len(record["fresh_starts"])
        fresh_why.update(record["fresh_starts"])
    write = terminalreporter.write_line
    terminalreporter.section("CPU by test file (--cpu-profile)")
    write(f"{len(records)} tests: {sum(wall.values()):.0f} s of test wall time, {sum(cpu.values()):.0f} CPU-s")
    write(f"{'CPU-s':>8} {'wall s':>8} {'tests':>5}  file")
    for name, seconds in cpu.most_common(TOP_FILES):
        write(f"{seconds:8.1f} {wall[name]:8.1f} {count[name]:5d}  {name}")
    files, rest, rest_files = _top(fresh_by_file)
    shown = ", ".join(f"{n} {name}" for name, n in files) + (
        f", {rest} in {rest_files} other files" if rest_files else ""
    )
    write(f"{fresh_by_file.total()} commands that could start warm (tests/warm.py) started fresh; by file: {shown}")
    reasons, rest, rest_reasons = _top(fresh_why)
    for why, n in reasons:
        write(f"{n:8d}  {why}")
    if rest_reasons:
        write(f"{rest:8d}  {rest_reasons} other reasons")
    _write_workers(write, records, config.stash.get(SESSION_START, min(r["start"] for r in records)))
    if servers:
        write(
            f"warm servers: {sum(s['servers'] for s in servers)} started ({', '.join(str(s['servers']) for s in servers)} "
            f"by worker), {sum(s['cpu_s'] for s in servers):.1f} CPU-s of their own (in no test's figure)"
        )
    write(f"records: {directory}/tests-*.jsonl; each file's seconds: {directory}/file_seconds.json")
    seconds = {name: round(wall[name], 1) for name in sorted(wall)}
    (Path(directory) / "file_seconds.json").write_text(json.dumps(seconds, indent=1) + "\n")


def _top(counter: collections.Counter) -> tuple[list[tuple[str, int]], int, int]:
    """The :data:`TOP_FRESH` largest positive counts, then the others' total and number, so that what
    the summary prints adds up to the counter's total."""
    ranked = (+counter).most_common()
    others = ranked[TOP_FRESH:]
    return ranked[:TOP_FRESH], sum(n for _, n in others), len(others)


def _write_workers(write, records: list[dict], origin: float) -> None:
    """Per xdist worker: its seconds in tests, and when (from ``origin``, the session's start) its
    first test began and its last ended: the rest of pytest's own time is start-up, collection, gaps
    and the end."""
    by_worker: dict[str, list[dict]] = collections.defaultdict(list)
    for record in records:
        by_worker[record["worker"]].append(record)
    for worker, mine in sorted(by_worker.items()):
        first = min(r["start"] for r in mine) - origin
        last = max(r["start"] + r["wall_s"] for r in mine) - origin
        busy = sum(r["wall_s"] for r in mine)
        write(
            f"{worker}: {busy:.0f} s in {len(mine)} tests; the first began at {first:.1f} s, the last ended at "
            f"{last:.1f} s ({last - first - busy:.1f} s between tests)"
        )
