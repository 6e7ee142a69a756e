"""`shoal launch --hosts` from one node to two: two network namespaces joined by a veth pair.

The "nodes" come from :mod:`cluster.netns` (10.77.x.1 and 10.77.x.2, one interface each, a hostname
that resolves to 127.0.0.1 in both, as on many clusters). ``shoal launch`` runs inside the first.
There is no sshd: a small rsh agent stands in for ssh, as mpirun's ``plm_rsh_agent`` and as
``--rsh``. Given ``HOST COMMAND...`` it runs the command line in that host's namespace with
``sh -c``, which is what ssh does on a real node (and, like ssh, it keeps stdin connected).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from procs import launcher_free_env, wait_for

try:
    from cluster.netns import netns_unavailable, node_pair
except ImportError:  # pragma: no cover - the fixture module belongs to the multi-node tests
    netns_unavailable = lambda: "tests/cluster/netns.py (the two-namespace fixture) is missing"  # noqa: E731
    node_pair = None

pytestmark = pytest.mark.multiprocess

SCRIPTS = Path(__file__).parent / "scripts"
ALLREDUCE = str(SCRIPTS / "shoal_init_allreduce.py")
FAILS = str(SCRIPTS / "rank1_fails.py")
LAUNCH = [sys.executable, "-m", "shoal.cli.launch"]


@pytest.fixture(scope="module")
def nodes():
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    with node_pair(tag=f"l{os.getpid() % 10**7}", subnet=177 % 256) as pair:
        yield pair


def _rsh_agent(tmp_path: Path, nodes, extra_env: dict[str, dict[str, str]] | None = None) -> str:
    lines = [
        "#!/bin/sh",
        "# rsh agent: HOST COMMAND... runs the command line in HOST's namespace, as ssh would.",
        "host=$1; shift",
        'case "$host" in',
    ]
    for node in nodes:
        env = " ".join(f"{k}={v}" for k, v in (extra_env or {}).get(node.name, {}).items())
        lines.append(f'  {node.addr}) exec ip netns exec {node.name} {"env " + env + " " if env else ""}sh -c "$*" ;;')
    lines += ["esac", 'echo "rsh agent: unknown host $host" >&2', "exit 255", ""]
    path = tmp_path / "netns-rsh"
    path.write_text("\n".join(lines))
    path.chmod(0o755)
    return str(path)


def _env(**extra: str) -> dict[str, str]:
    # SHOAL_INIT_TIMEOUT: a failure shows in well under the test's timeout.
    return launcher_free_env(drop=("GLOO_", "NCCL_"), **{"SHOAL_INIT_TIMEOUT": "40", **extra})


def _launch(nodes, tmp_path: Path, via: str, script: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """``shoal launch --hosts a:1,b:1 --via VIA --rsh <the agent> -- SCRIPT tmp_path``, run in a."""
    a, b = nodes
    hosts, rsh = f"{a.addr}:1,{b.addr}:1", _rsh_agent(tmp_path, nodes)
    command = [*LAUNCH, "--hosts", hosts, "--via", via, "--rsh", rsh, "--", script, str(tmp_path)]
    return a.run(command, env=_env(), capture_output=True, text=True, timeout=timeout)


def _results(out: Path, n: int) -> list[dict]:
    found = sorted(out.glob("rank*.json"))
    assert len(found) == n, f"expected {n} result files, got {[p.name for p in found]}"
    return sorted((json.loads(p.read_text()) for p in found), key=lambda r: r["rank"])


@pytest.mark.skipif(
    shutil.which("mpirun") is None,
    reason="Open MPI's mpirun is not installed (scripts/install-system-deps.sh installs openmpi-bin)",
)
def test_launch_hosts_via_mpirun_across_namespaces(nodes, tmp_path):
    a, b = nodes
    # Nobody sets GLOO_SOCKET_IFNAME: shoal.init() picks each node's interface that routes to the
    # main address (the machine's hostname resolves to 127.0.0.1 in both namespaces).
    proc = _launch(nodes, tmp_path, "mpirun", ALLREDUCE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"shoal launch: mpirun, 2 processes on {a.addr}:1,{b.addr}:1, rendezvous {a.addr}:" in proc.stderr
    results = _results(tmp_path, 2)
    assert [(r["scheme"], r["rank"], r["world_size"], r["node_rank"], r["num_nodes"]) for r in results] == [
        ("openmpi", 0, 2, 0, 2),
        ("openmpi", 1, 2, 1, 2),
    ]
    assert [r["gloo_socket_ifname"] for r in results] == [a.ifname, b.ifname]  # rank 1 ran in b
    assert {r["main_address"] for r in results} == {a.addr} and {r["sum"] for r in results} == {3.0}


def test_launch_hosts_via_ssh_across_namespaces(nodes, tmp_path):
    """One `shoal run` per host; shoal run picks each node's interface itself."""
    a, b = nodes
    proc = _launch(nodes, tmp_path, "ssh", ALLREDUCE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = _results(tmp_path, 2)
    assert [(r["scheme"], r["rank"], r["world_size"], r["node_rank"]) for r in results] == [
        ("torchrun", 0, 2, 0),
        ("torchrun", 1, 2, 1),
    ]
    assert [r["gloo_socket_ifname"] for r in results] == [a.ifname, b.ifname]
    assert {r["sum"] for r in results} == {3.0}


def test_a_failing_host_stops_the_others(nodes, tmp_path):
    """b's worker exits 3; a's would wait forever: shoal launch stops a's launcher and its worker."""
    a, b = nodes
    proc = _launch(nodes, tmp_path, "ssh", FAILS, timeout=180)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    # "; stopping the other hosts" follows when a's launcher still ran; on a busy machine it may have
    # ended first (its worker saw the peer go), and the line says nothing more. No hang: timeout above.
    assert f"host {b.addr} (node 1) exited with status 3" in proc.stderr
    pids = [int((tmp_path / f"rank{r}.pid").read_text()) for r in (0, 1)]
    wait_for(
        lambda: not any(_running_in(node) for node in nodes), 10, 0.2, "no process left in the namespaces",
        details=lambda: f"{ {node.name: _running_in(node) for node in nodes} } (workers: {pids})",
    )  # fmt: skip


def _running_in(node) -> list[str]:
    """Live processes in ``node``'s namespace (zombies waiting for a reaper do not count)."""
    out = subprocess.run(["ip", "netns", "pids", node.name], capture_output=True, text=True).stdout.split()
    live = []
    for pid in out:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    live.append(pid)
        except (FileNotFoundError, IndexError):
            pass
    return live
