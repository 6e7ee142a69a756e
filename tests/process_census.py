"""Where a full run's CPU goes, process by process: the kernel's process accounting (``acct(2)``, one
record per process as it ends: command name, PID, parent, start, CPU) against ``--cpu-profile``'s
records (tests/cpu_profile.py). Each process is given to the test that was running on the xdist
worker it descends from when it started (a command a warm server forked: the worker that asked for
it); the report counts the processes of 1 CPU-s or more, which are nearly all interpreters that
import torch (docs/TEST_TIME.md, "Latest runs")::

    .venv/bin/python tests/process_census.py on /tmp/pacct   # as root; system-wide: nothing else running
    make test PYTEST_ARGS="-n 3 --dist loadgroup --no-loadscope-reorder --cpu-profile=/tmp/cpu"
    .venv/bin/python tests/process_census.py off
    .venv/bin/python tests/process_census.py report /tmp/pacct /tmp/cpu

``off`` ends all process accounting on the machine, a previous one's too. Records are Linux's
``struct acct_v3`` (include/uapi/linux/acct.h): 64 bytes, times in ``comp_t`` of AHZ (100) ticks.
"""

from __future__ import annotations

import collections
import ctypes
import struct
import sys
from collections.abc import Iterable
from pathlib import Path

RECORD = struct.Struct("<BBHIIIIIIf8H16s")
"""ac_flag, ac_version, ac_tty, ac_exitcode, ac_uid, ac_gid, ac_pid, ac_ppid, ac_btime, ac_etime,
ac_utime, ac_stime, ac_mem, ac_io, ac_rw, ac_minflt, ac_majflt, ac_swaps, ac_comm."""
AHZ = 100
HEAVY_CPU_S = 1.0


def comp_t(value: int) -> int:
    """A ``comp_t``: a 13-bit mantissa and a 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (3 * (value >> 13))


def read_records(path: str | Path) -> list[dict]:
    """The records of an accounting file: pid, ppid, btime (seconds since the epoch), cpu_s, comm."""
    data = Path(path).read_bytes()
    records = []
    for offset in range(0, len(data) - RECORD.size + 1, RECORD.size):
        fields = RECORD.unpack_from(data, offset)
        records.append(
            {
                "pid": fields[6],
                "ppid": fields[7],
                "btime": fields[8],
                "cpu_s": (comp_t(fields[10]) + comp_t(fields[11])) / AHZ,
                "comm": fields[18].split(b"\0")[0].decode(errors="replace"),
            }
        )
    return records


def census(records: list[dict], tests: list[dict], servers: Iterable[int] = ()) -> dict:
    """Each process under a worker (a ``pid`` of ``tests``) given to the test running there when it
    started; the rest counted apart. A command a warm server forked (a test's ``warm_pids``) descends
    from the worker that asked for it, not from the server's starter, which the workers share
    (tests/warm.py); the servers themselves (``servers``, their PIDs) are counted apart."""
    parent = {r["pid"]: r["ppid"] for r in records}
    by_worker = collections.defaultdict(list)
    for test in tests:
        by_worker[test["pid"]].append((test["start"] - 1, test["start"] + test["wall_s"] + 1, test["test"]))
        for pid in test.get("warm_pids", ()):
            parent[pid] = test["pid"]
    servers = set(servers)

    def worker_of(pid: int) -> int | None:
        for _ in range(64):  # up the parents, as they were when each process ended
            if pid in by_worker:
                return pid
            if pid not in parent:
                return None
            pid = parent[pid]
        return None

    per_test: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0, 0.0])
    outside, warm_servers = [0, 0.0], [0, 0.0]
    for record in records:
        if record["pid"] in by_worker:
            continue  # the workers themselves
        if record["pid"] in servers:
            warm_servers[0] += 1
            warm_servers[1] += record["cpu_s"]
            continue
        worker = worker_of(record["pid"])
        test = next((name for start, end, name in by_worker.get(worker, ()) if start <= record["btime"] <= end), None)
        if test is None:
            outside[0] += 1
            outside[1] += record["cpu_s"]
            continue
        counts = per_test[test.split("@")[0]]
        counts[0] += 1
        counts[1] += record["cpu_s"]
        if record["cpu_s"] >= HEAVY_CPU_S:
            counts[2] += 1
            counts[3] += record["cpu_s"]
    by_comm = collections.Counter()
    for record in records:
        by_comm[record["comm"]] += record["cpu_s"]
    return {
        "per_test": per_test,
        "outside": outside,
        "servers": warm_servers,
        "by_comm": by_comm,
        "processes": len(records),
    }


def report(accounting: str, profile: str) -> None:
    from cpu_profile import read_profile  # this directory's: the script's own (imports pytest)

    records = read_records(accounting)
    tests, summaries = read_profile(profile)
    found = census(records, tests, [pid for summary in summaries for pid in summary.get("pids", ())])
    per_test = found["per_test"]
    in_tests = sum(c[1] for c in per_test.values())
    heavy, heavy_cpu = sum(c[2] for c in per_test.values()), sum(c[3] for c in per_test.values())
    print(f"{found['processes']} processes ended, {sum(r['cpu_s'] for r in records):.1f} CPU-s among them")
    print(f"started by tests: {sum(c[0] for c in per_test.values())} processes, {in_tests:.1f} CPU-s")
    print(
        f"  of {HEAVY_CPU_S:g} CPU-s or more: {heavy} processes, {heavy_cpu:.1f} CPU-s ({heavy_cpu / max(in_tests, 1e-9):.0%})"
    )
    print(f"not under a worker's test: {found['outside'][0]} processes, {found['outside'][1]:.1f} CPU-s")
    print(f"warm servers: {found['servers'][0]} processes, {found['servers'][1]:.1f} CPU-s")
    print("by command name:", ", ".join(f"{name} {cpu:.1f}" for name, cpu in found["by_comm"].most_common(8)))
    print("tests with the most CPU in processes of their own (processes, of them heavy, CPU-s):")
    for name, (count, cpu, many, _) in sorted(per_test.items(), key=lambda kv: -kv[1][1])[:20]:
        print(f"  {cpu:7.1f}  {count:5d} {many:3d}  {name}")


def main(argv: list[str]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if argv[:1] == ["on"] and len(argv) == 2:
        Path(argv[1]).touch()
        if libc.acct(argv[1].encode()) != 0:
            sys.exit(
                f"acct({argv[1]}) failed: errno {ctypes.get_errno()} (root, and a kernel with BSD process accounting)"
            )
    elif argv == ["off"]:
        libc.acct(None)
    elif argv[:1] == ["report"] and len(argv) == 3:
        report(argv[1], argv[2])
    else:
        sys.exit("usage: process_census.py on FILE | off | report FILE CPU_PROFILE_DIR")


if __name__ == "__main__":
    main(sys.argv[1:])
