"""The pod helpers of :mod:`cluster.pods` and :mod:`cluster.sshd` do what their users rely on.

Names resolve per pod, host names are the pods' own, mounts land only in their pod (the host's /etc,
/root and /run stay as they are), sixteen pods share one bridge, and everything goes away on exit,
also when the test body raises.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.pods import NETNS_ETC, Mount, PodSpec, pod_network, pods_unavailable
from cluster.sshd import SSH_OPTIONS, ssh_keypair, sshd_unavailable, start_sshd


@pytest.fixture(autouse=True)
def _need_pods():
    reason = pods_unavailable()
    if reason:
        pytest.skip(reason)


def _sh(pod, script: str) -> str:
    proc = pod.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


SERVE = "import socket; s = socket.create_server(('0.0.0.0', 7000)); c, _ = s.accept(); c.sendall(b'ok'); c.close()"
CONNECT = """
import socket, sys, time
for _ in range(100):
    try:
        print(socket.create_connection((sys.argv[1], 7000), timeout=5).recv(2).decode()); break
    except ConnectionRefusedError:
        time.sleep(0.1)
"""


def _reaches(src, dst, name: str) -> bool:
    """True if a TCP connection from ``src`` to ``name`` (resolved in ``src``) lands in ``dst``."""
    server = dst.popen([sys.executable, "-c", SERVE])
    try:
        out = src.run([sys.executable, "-c", CONNECT, name], capture_output=True, text=True, timeout=60)
        return out.stdout.strip() == "ok"
    finally:
        server.kill()
        server.wait()


def _ours() -> list[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in listing.splitlines() if line.startswith(f"shpod{os.getpid()}")]


def test_names_host_names_and_mounts_are_per_pod(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "hello.txt").write_text("hi\n")
    specs = [
        PodSpec("a", hostname="job-master-0", resolves={"job-worker-0": "b", "job-worker-0.ns.svc": "b"}),
        PodSpec(
            "b",
            hostname="job-worker-0",
            resolves={"job-master-0": "a"},
            mounts=[Mount("/mnt/data", str(data), read_only=True), Mount("/dev/shm", None, size="16m")],
        ),
    ]
    host_etc_hosts = Path("/etc/hosts").read_text()
    with pod_network(specs, tag="t") as net:
        a, b = net["a"], net["b"]
        assert _sh(a, "hostname") == "job-master-0" and _sh(b, "hostname") == "job-worker-0"
        assert _sh(a, "getent hosts job-worker-0.ns.svc").split()[0] == b.addr
        assert _sh(b, "getent hosts job-master-0").split()[0] == a.addr
        assert _sh(b, "getent hosts job-worker-0").split()[0] == b.addr  # its own name, as the kubelet writes it
        assert a.run(["getent", "hosts", "elsewhere.example"], capture_output=True, timeout=30).returncode != 0
        assert _sh(b, "cat /mnt/data/hello.txt") == "hi"
        assert b.run(["sh", "-c", "echo x > /mnt/data/new"], capture_output=True).returncode != 0  # read-only
        assert "16M" in _sh(b, "df -h /dev/shm | tail -1")
        assert _sh(a, "ls /mnt/data 2>/dev/null; echo end") == "end"  # a has no such mount
        assert _sh(a, "ip -o -4 addr show eth0").split()[3] == f"{a.addr}/24"
        assert _reaches(a, b, "job-worker-0.ns.svc") and _reaches(b, a, "job-master-0")
    assert Path("/etc/hosts").read_text() == host_etc_hosts
    assert _ours() == [] and not any(p.startswith(f"shpod{os.getpid()}") for p in os.listdir(NETNS_ETC))


def test_a_mount_point_missing_on_the_host_is_made_in_the_pod_only(tmp_path):
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "id_rsa").write_text("key\n")
    (tmp_path / "hostfile").write_text("w-0 slots=1\n")
    host_run_sshd = os.path.exists("/run/sshd")
    mounts = [
        Mount("/root/.ssh-shoal-test", str(secret)),
        Mount("/etc/mpi-shoal-test/hostfile", str(tmp_path / "hostfile")),
    ]
    with pod_network([PodSpec("p", resolves={}, mounts=mounts)], tag="o") as net:
        assert _sh(net["p"], "cat /root/.ssh-shoal-test/id_rsa /etc/mpi-shoal-test/hostfile") == "key\nw-0 slots=1"
        assert _sh(net["p"], "getent hosts p").split()[0] == net["p"].addr  # /etc overlaid, its hosts still bound
        assert _sh(net["p"], "test -d /run/sshd && echo private-run") == "private-run"
    assert not os.path.exists("/root/.ssh-shoal-test") and not os.path.exists("/etc/mpi-shoal-test")
    assert os.path.exists("/run/sshd") == host_run_sshd  # the pod's /run was its own


def test_sixteen_pods_on_one_bridge():
    specs = [PodSpec(f"n{i}", resolves={f"n{j}": f"n{j}" for j in range(16)}) for i in range(16)]
    with pod_network(specs, tag="b") as net:
        assert len(net) == 16 and len({p.addr for p in net}) == 16
        assert _reaches(net["n0"], net["n15"], "n15") and _reaches(net["n15"], net["n7"], "n7")


def test_everything_goes_away_when_the_test_body_raises():
    started = []
    with (
        pytest.raises(RuntimeError, match="the test failed"),
        pod_network([PodSpec("x"), PodSpec("y")], tag="f") as net,
    ):
        started.append(net["x"].popen(["sleep", "600"]))
        started.append(net["y"].popen(["sh", "-c", "sleep 600 & sleep 600"]))
        raise RuntimeError("the test failed")
    assert all(proc.poll() is not None for proc in started)
    assert _ours() == []


def test_a_real_sshd_in_a_pod_takes_the_key_and_only_that_key(tmp_path):
    reason = sshd_unavailable()
    if reason:
        pytest.skip(reason)
    good, bad = ssh_keypair(tmp_path / "good"), ssh_keypair(tmp_path / "bad")
    with pod_network([PodSpec("client", resolves={"server": "server"}), PodSpec("server")], tag="h") as net:
        server = start_sshd(net["server"], tmp_path / "sshd", authorized_keys=good.authorized_keys(tmp_path / "auth"))
        ok = net["client"].run(
            ["ssh", "-i", str(good.private), *SSH_OPTIONS, "server", "hostname"], capture_output=True, text=True
        )
        assert ok.returncode == 0 and ok.stdout.strip() == "server", ok.stderr
        refused = net["client"].run(
            ["ssh", "-i", str(bad.private), *SSH_OPTIONS, "server", "true"], capture_output=True, text=True
        )
        assert refused.returncode == 255 and "Permission denied" in refused.stderr
        assert len(server.accepted()) == 1
        pid = server.pid
        server.stop()
        assert not os.path.exists(f"/proc/{pid}")
