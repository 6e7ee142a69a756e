"""``shoal launch --hosts`` through a real SSH server: pods with sshd, the default ssh client, no wrapper.

Four pods on one bridge (:mod:`cluster.pods`), each resolving the others as ``node0``..``node3``:

- ``node0``, the head: ``shoal launch`` runs here, with a key pair in /root/.ssh and a known_hosts
  file naming node1's and node3's host keys, as on a cluster where SSH is set up;
- ``node1``: sshd (Debian's openssh-server) accepting node0's key;
- ``node2``: no sshd;
- ``node3``: sshd accepting another key only.

``--via ssh`` and ``--via mpirun`` both reach node1 with plain ``ssh`` (mpirun's default agent).
The bad input of issue 12 (no sshd, a wrong key, an unknown host, slots < 1) fails in one line with a
HINT, quickly, and leaves no process in any pod; a rank that fails under mpirun is named with its
cause even when a rank stopped because of it ends first.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.pods import Mount, PodSpec, left_behind, pod_network, pods_unavailable
from cluster.sshd import ssh_keypair, sshd_unavailable, start_sshd
from procs import launcher_free_env

pytestmark = pytest.mark.multiprocess
SCRIPTS = Path(__file__).parent / "scripts"
ALLREDUCE = str(SCRIPTS / "shoal_init_allreduce.py")
LAUNCH = [sys.executable, "-m", "shoal.cli.launch"]
NODES = ("node0", "node1", "node2", "node3")
needs_mpirun = pytest.mark.skipif(
    shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed (openmpi-bin)"
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = pods_unavailable() or sshd_unavailable()
    if reason:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("ssh-cluster")
    head_ssh = base / "head-ssh"
    key = ssh_keypair(head_ssh)
    stranger = ssh_keypair(base / "stranger")
    names = {name: name for name in NODES}
    specs = [
        PodSpec(n, resolves=names, mounts=[Mount("/root/.ssh", str(head_ssh))] if n == "node0" else []) for n in NODES
    ]
    with pod_network(specs, tag="s") as net:
        good = start_sshd(net["node1"], base / "sshd1", authorized_keys=key.authorized_keys(base / "auth1"))
        other = start_sshd(net["node3"], base / "sshd3", authorized_keys=stranger.authorized_keys(base / "auth3"))
        known = []
        for node, server in (("node1", good), ("node3", other)):
            host_key = (server.config.parent / "ssh_host_ed25519_key.pub").read_text().split()[:2]
            known.append(f"{node},{net[node].addr} {' '.join(host_key)}")
        (head_ssh / "known_hosts").write_text("\n".join(known) + "\n")
        yield net, {"node1": good, "node3": other}


def _env() -> dict[str, str]:
    return launcher_free_env(drop=("GLOO_", "NCCL_"), HOME="/root", SHOAL_INIT_TIMEOUT="40")


def _launch(net, args, cwd: Path, timeout: float = 240) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    proc = net["node0"].run([*LAUNCH, *args], env=_env(), cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - started


def _assert_nothing_left(net, servers) -> None:
    """No process in any pod but its sshd (zombies excluded); give stopped ones a moment to go."""
    left = left_behind(list(net), keep=[server.pid for server in servers.values()])
    assert not left, f"processes left behind: {left}"


def _results(out: Path, n: int) -> list[dict]:
    found = sorted(out.glob("rank*.json"))
    assert len(found) == n, f"expected {n} result files, got {[p.name for p in found]}"
    return sorted((json.loads(p.read_text()) for p in found), key=lambda r: r["rank"])


def test_launch_via_ssh_reaches_a_real_sshd(cluster, tmp_path):
    net, servers = cluster
    proc, _ = _launch(net, ["--hosts", "node0:1,node1:1", "--via", "ssh", "--", ALLREDUCE, str(tmp_path)], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 here, 1 over ssh" in proc.stderr
    results = _results(tmp_path, 2)
    assert [(r["scheme"], r["rank"], r["world_size"], r["host"]) for r in results] == [
        ("torchrun", 0, 2, "node0"),
        ("torchrun", 1, 2, "node1"),
    ]
    assert {r["sum"] for r in results} == {3.0}
    assert any(f"from {net['node0'].addr}" in line for line in servers["node1"].accepted())
    _assert_nothing_left(net, servers)


@needs_mpirun
def test_launch_via_mpirun_reaches_a_real_sshd(cluster, tmp_path):
    net, servers = cluster
    proc, _ = _launch(net, ["--hosts", "node0:1,node1:1", "--via", "mpirun", "--", ALLREDUCE, str(tmp_path)], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = _results(tmp_path, 2)
    assert [(r["scheme"], r["rank"], r["world_size"], r["host"]) for r in results] == [
        ("openmpi", 0, 2, "node0"),
        ("openmpi", 1, 2, "node1"),
    ]
    assert "shoal-rank-status" not in proc.stderr  # the status lines are shoal's, not the user's
    _assert_nothing_left(net, servers)


@needs_mpirun
def test_a_failing_rank_is_named_with_its_cause_not_the_rank_it_stopped(cluster, tmp_path):
    """Rank 0 ends first with 75 (a node stopped because another failed); rank 1 fails with 3 a moment
    later: mpirun alone would report rank 0; shoal launch names rank 1 and returns its status."""
    net, servers = cluster
    script = 'if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then exit 75; fi; sleep 2; echo "rank 1 failed" >&2; exit 3'
    proc, _ = _launch(net, ["--hosts", "node0:1,node1:1", "--via", "mpirun", "--", "sh", "-c", script], tmp_path)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "shoal launch: rank 1 on node1 exited with status 3" in proc.stderr
    assert "rank 1 failed" in proc.stderr
    _assert_nothing_left(net, servers)


BAD_INPUT = [
    (["--hosts", "node0:1,node2:1", "--via", "ssh"], "cannot run a command on node2 over ssh: ", "Connection refused", "start the SSH server on node2"),
    (["--hosts", "node0:1,node2:1", "--via", "mpirun"], "cannot run a command on node2 over ssh: ", "Connection refused", "start the SSH server on node2"),
    (["mpirun", "--hosts", "node0:1,node2:1"], "cannot run a command on node2 over ssh: ", "Connection refused", "start the SSH server on node2"),
    (["--hosts", "node0:1,node3:1", "--via", "ssh"], "cannot run a command on node3 over ssh: ", "Permission denied", "ssh-copy-id node3"),
    (["--hosts", "node0:1,node3:1", "--via", "mpirun"], "cannot run a command on node3 over ssh: ", "Permission denied", "ssh-copy-id node3"),
    (["--hostfile", "{unknown}", "--via", "ssh"], "cannot run a command on ghost over ssh: ", "resolve", "this machine cannot resolve it"),
    (["--hostfile", "{unknown}", "--via", "mpirun"], "cannot run a command on ghost over ssh: ", "resolve", "this machine cannot resolve it"),
    (["--hostfile", "{zero}", "--via", "ssh"], "hostfile ", "slots '0' is not a whole number of at least 1", "node1 slots=4"),
]  # fmt: skip


@pytest.mark.parametrize("args, message, reason, hint", BAD_INPUT, ids=[f"{a[1][:14]}-{a[-1]}" for a, *_ in BAD_INPUT])
def test_bad_hosts_fail_in_one_line_quickly_and_leave_nothing(cluster, tmp_path, args, message, reason, hint):
    net, servers = cluster
    if "mpirun" in args and shutil.which("mpirun") is None:
        pytest.skip("Open MPI's mpirun is not installed")
    (tmp_path / "unknown").write_text("node0 slots=1\nghost slots=1\n")
    (tmp_path / "zero").write_text("node0 slots=1\nnode1 slots=0\n")
    args = [a.format(unknown=tmp_path / "unknown", zero=tmp_path / "zero") for a in args]
    proc, elapsed = _launch(net, [*args, "--", ALLREDUCE, str(tmp_path)], tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("shoal: error: " + message) and reason in lines[0], proc.stderr
    assert lines[1].startswith("HINT: ") and hint in lines[1]
    assert elapsed < 60, f"took {elapsed:.0f} s to fail"
    assert not list(tmp_path.glob("rank*.json")), "no rank may have started"
    _assert_nothing_left(net, servers)


@pytest.mark.parametrize("via", ["ssh", pytest.param("mpirun", marks=needs_mpirun)])
def test_an_unchanged_torchrun_script_sees_torchruns_contract_across_hosts(cluster, tmp_path, via):
    """Hosts with different slot counts (node0:2, node1:1): every rank sees torchrun's variables with
    consistent values, GROUP_RANK naming its host (Open MPI's variables alone cannot tell it then)."""
    from contract.torchrun import SCRIPT, check_report, report_from_file

    net, servers = cluster
    report = tmp_path / "contract.json"
    proc, _ = _launch(net, ["--hosts", "node0:2,node1:1", "--via", via, "--", str(SCRIPT), str(report)], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = check_report(report_from_file(report), world=3, nodes=2)
    assert [(v["GROUP_RANK"], v["LOCAL_RANK"], v["LOCAL_WORLD_SIZE"]) for v in ranks] == [
        ("0", "0", "2"),
        ("0", "1", "2"),
        ("1", "0", "1"),
    ]
    assert {v["MASTER_ADDR"] for v in ranks} & {"node0", net["node0"].addr}  # as given, or resolved
    _assert_nothing_left(net, servers)
