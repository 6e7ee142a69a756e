"""tests/process_census.py reads the kernel's ``struct acct_v3`` records and gives each process to the
test that started it (the records here are packed in the kernel's layout: include/uapi/linux/acct.h;
turning accounting on is system-wide, so the suite never does it)."""

from __future__ import annotations

from process_census import RECORD, census, comp_t, read_records


def _record(pid: int, ppid: int, btime: int, cpu_ticks: int, comm: bytes) -> bytes:
    # ac_flag, ac_version 3, tty, exitcode, uid, gid, pid, ppid, btime, etime, utime, stime, 6 more comp_t, comm
    return RECORD.pack(0, 3, 0, 0, 0, 0, pid, ppid, btime, 1.0, cpu_ticks, 0, 0, 0, 0, 0, 0, 0, comm)


def test_a_record_is_the_kernels_64_bytes_and_comp_t_scales_by_eight():
    assert RECORD.size == 64
    assert comp_t(250) == 250 and comp_t((1 << 13) | 5) == 40 and comp_t((2 << 13) | 5) == 320


def test_each_process_goes_to_the_test_running_on_the_worker_it_descends_from(tmp_path):
    accounting = tmp_path / "pacct"
    accounting.write_bytes(
        _record(200, 100, 1010, 250, b"python")  # a launcher of the first test on worker 100
        + _record(300, 200, 1011, 50, b"python")  # its rank
        + _record(400, 100, 1030, 120, b"shoal")  # the second test's command
        + _record(500, 1, 1012, 300, b"slurmstepd")  # under no worker
        + _record(100, 1, 1000, 900, b"python")  # the worker itself
    )
    records = read_records(accounting)
    assert [r["comm"] for r in records] == ["python", "python", "shoal", "slurmstepd", "python"]
    assert records[0]["cpu_s"] == 2.5 and records[0]["btime"] == 1010
    tests = [
        {"test": "t.py::first@t.py", "start": 1009.5, "wall_s": 10.0, "pid": 100},
        {"test": "t.py::second", "start": 1025.0, "wall_s": 10.0, "pid": 100},
    ]
    found = census(records, tests)
    assert dict(found["per_test"]) == {"t.py::first": [2, 3.0, 1, 2.5], "t.py::second": [1, 1.2, 1, 1.2]}
    assert found["outside"] == [1, 3.0] and found["processes"] == 5


def test_a_command_a_shared_warm_server_forked_goes_to_the_test_that_asked_for_it(tmp_path):
    # Worker 100 started the warm server 150; worker 101's test asked it for command 160 (whose rank
    # is 170): the kernel's parent of 160 is 150, under worker 100, whose own test ran meanwhile.
    accounting = tmp_path / "pacct"
    accounting.write_bytes(
        _record(160, 150, 1012, 40, b"python")  # the command forked for worker 101's test
        + _record(170, 160, 1013, 300, b"python")  # its rank
        + _record(180, 150, 1014, 20, b"python")  # a command forked for worker 100's test
        + _record(150, 100, 1001, 280, b"python")  # the server
    )
    tests = [
        {"test": "a.py::on_100", "start": 1010.0, "wall_s": 10.0, "pid": 100, "warm_pids": [180]},
        {"test": "b.py::on_101", "start": 1011.0, "wall_s": 10.0, "pid": 101, "warm_pids": [160]},
    ]
    found = census(read_records(accounting), tests, servers=[150])
    assert dict(found["per_test"]) == {"b.py::on_101": [2, 3.4, 1, 3.0], "a.py::on_100": [1, 0.2, 0, 0.0]}
    assert found["servers"] == [1, 2.8] and found["outside"] == [0, 0.0]
    # Without the PIDs (records from before the workers shared servers), the kernel's tree decides.
    unmarked = [{**test, "warm_pids": []} for test in tests]
    assert set(census(read_records(accounting), unmarked)["per_test"]) == {"a.py::on_100"}
