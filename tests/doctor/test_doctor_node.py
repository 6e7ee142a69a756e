"""``shoal doctor`` on one node: real checks of this machine, and faults made real (a port held by a
listening socket, launcher variables that contradict each other, an interface that does not exist,
an open-files limit lowered with setrlimit, a checkpoint path that is a file), each named with its
HINT; the JSON document follows the published schema."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys

import jsonschema

import warm
from shoal.doctor.model import FAIL, OK, WARN
from shoal.doctor.network import _match_ifnames
from shoal.doctor.resources import nofile_check, shm_check
from shoal.doctor.schema import SCHEMA
from shoal.launch.ports import find_free_port

SOFTWARE = ("python", "torch", "cuda", "nccl", "shoal")


def _doctor(*args: str, env: dict[str, str] | None = None, nofile: int | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("SHOAL_ENV", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}

    def lower_nofile() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    return warm.run(
        [sys.executable, "-m", "shoal", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, **(env or {})},
        preexec_fn=lower_nofile,
    )


def _checks(document: dict) -> dict[str, dict]:
    (node,) = document["nodes"]
    return {check["name"]: check for check in node["checks"]}


def test_a_healthy_node_passes_every_check_and_the_json_follows_the_schema(tmp_path):
    port = find_free_port()
    proc = _doctor("--json", "--master", f"127.0.0.1:{port}", "--checkpoint-dir", str(tmp_path / "ckpt"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    document = json.loads(proc.stdout)
    jsonschema.validate(document, SCHEMA)
    checks = _checks(document)
    assert document["mode"] == "node" and document["status"] == OK, checks
    assert {c["status"] for c in checks.values()} == {OK}
    assert set(SOFTWARE) | {"gpus", "shm", "nofile", "checkpoint-dir", "launcher-env", "hostname"} <= set(checks)
    assert set(document["nodes"][0]["versions"]) == set(SOFTWARE)
    assert f"port {port} is free on 127.0.0.1 (this node is the master" in checks["master-port"]["summary"]
    assert checks["route"]["data"]["interface"] == "lo"
    plan = document["nodes"][0]["plan"]
    assert (plan["bind_addr"], plan["store_port"], plan["hosts_store"]) == ("127.0.0.1", port, True)


def test_faults_of_one_node_are_each_named_with_a_hint(tmp_path):
    not_a_dir = tmp_path / "ckpt"
    not_a_dir.write_text("a file\n")
    with socket.create_server(("127.0.0.1", 0)) as held:  # another job's store on the master's port
        port = held.getsockname()[1]
        proc = _doctor(
            "--json", "--master", f"127.0.0.1:{port}", "--checkpoint-dir", str(not_a_dir),
            env={"NCCL_SOCKET_IFNAME": "nosuch0", "GLOO_SOCKET_IFNAME": "lo", "RANK": "3", "WORLD_SIZE": "2",
                 "CUDA_VISIBLE_DEVICES": "0,0"},
            nofile=512,
        )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    document = json.loads(proc.stdout)
    jsonschema.validate(document, SCHEMA)
    checks = _checks(document)
    expected = {
        "master-port": (FAIL, f"port {port} is already in use on this machine", "stop what holds it"),
        "launcher-env": (FAIL, "RANK=3, WORLD_SIZE=2 set, but not LOCAL_RANK", "unset stray ones"),
        "nccl-socket-ifname": (
            FAIL,
            "NCCL_SOCKET_IFNAME=nosuch0: no such interface on this node",
            "set NCCL_SOCKET_IFNAME",
        ),
        "cuda-visible-devices": (FAIL, "CUDA_VISIBLE_DEVICES=0,0 lists 0 more than once", "list each GPU once"),
        "nofile": (FAIL, "open files limit 512", "ulimit -n"),
        "checkpoint-dir": (FAIL, f"{not_a_dir} is a file, not a directory", "give --checkpoint-dir a directory"),
    }
    for name, (status, summary, hint) in expected.items():
        check = checks[name]
        assert (check["status"], summary in check["summary"], hint in (check["hint"] or "")) == (status, True, True), (
            check
        )
    assert checks["gloo-socket-ifname"]["status"] == OK  # lo exists, and routes to the loopback master
    assert all(checks[name]["status"] == OK for name in (*SOFTWARE, "shm", "route", "master-resolves"))
    assert document["counts"][FAIL] == len(expected)

    text = _doctor(
        "--master", f"127.0.0.1:{port}", "--checkpoint-dir", str(not_a_dir), env={"NCCL_SOCKET_IFNAME": "nosuch0"}
    )
    assert text.returncode == 1
    rows = text.stdout.splitlines()
    at = next(i for i, row in enumerate(rows) if row.split()[:2] == ["fail", "nccl-socket-ifname"])
    assert rows[at + 1].strip().startswith("HINT: set NCCL_SOCKET_IFNAME to the interface the nodes share")
    assert rows[-1].startswith("shoal doctor: FAILED (2 fail")
    assert (
        f"rendezvous plan: as node 0 of a job, this node would serve the static rendezvous store on 127.0.0.1:{port}"
        in text.stdout
    )


def test_open_files_and_shared_memory_against_what_the_job_needs():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (2048, hard))
        tight = nofile_check()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert tight.status == WARN and "open files limit 2048" in tight.summary and "ulimit -n" in tight.hint
    assert nofile_check().status == (OK if soft >= 4096 else WARN)

    st = os.statvfs("/dev/shm")
    size = st.f_blocks * st.f_frsize
    workers = size // (128 << 20) + 1  # one more DataLoader worker than this /dev/shm holds
    assert shm_check(1, workers).status == FAIL
    assert "--shm-size" in shm_check(1, workers).hint
    assert shm_check(1, 0).status == OK


def test_interface_variables_follow_nccl_and_gloo_matching_rules():
    names = ["lo", "eth0", "eth1", "ib0"]
    assert _match_ifnames("eth", names, prefixes=True) == (["eth0", "eth1"], [])  # NCCL: prefixes
    assert _match_ifnames("=eth", names, prefixes=True) == ([], ["=eth"])  # NCCL: = is exact
    assert _match_ifnames("eth", names, prefixes=False) == ([], ["eth"])  # gloo: exact names
    assert _match_ifnames("eth1,ib9", names, prefixes=False) == (["eth1"], ["ib9"])


def test_help_does_not_import_torch():
    code = (
        "import sys\nfrom shoal.cli.main import main\ntry:\n    main(['doctor', '--help'])\n"
        "except SystemExit:\n    pass\nprint('torch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip().splitlines()[-1] == "False", proc.stdout + proc.stderr
    assert "--checkpoint-dir DIR" in proc.stdout and "--nnodes N|MIN:MAX" in proc.stdout


def test_more_processes_than_cores_is_a_warning():
    cores = len(os.sched_getaffinity(0))
    proc = _doctor("--json", "--nproc", str(cores + 1))
    document = json.loads(proc.stdout)
    check = _checks(document)["cores"]
    assert check["status"] == WARN and proc.returncode == 0, check
    plural = "s" if cores != 1 else ""
    assert check["summary"] == (
        f"{cores + 1} worker processes on {cores} usable core{plural}: they take turns, and every collective "
        "waits for the one that is not running"
    )
    assert (
        check["hint"]
        == f"use --nproc {cores} or fewer on this machine (more processes than cores only slow the job down)"
    )
