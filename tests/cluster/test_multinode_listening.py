"""Across nodes, a job listens only on the address of the link between the nodes (issue 15).

Two namespace nodes joined by two links (two veth pairs, two private subnets): while
the workers hold (tests/launch/scripts/hold.py), every listening TCP socket owned by each node's
launcher and its descendants is read from /proc (tests/listening.py).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.helpers import clean_env
from cluster.netns import node_pair
from listening import descendants, listening
from procs import wait_for

pytestmark = pytest.mark.multiprocess

HOLD = str(Path(__file__).parents[1] / "launch" / "scripts" / "hold.py")


@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_across_nodes_only_the_link_address_listens(tmp_path, backend, netns_skip_reason):
    """Each namespace node also has a second interface with another private address: the job's
    stores and gloo listen on the address of the link it meets on, only (the second link's pair of
    interfaces goes when the namespaces are deleted)."""
    if netns_skip_reason:
        pytest.skip(netns_skip_reason)
    with node_pair(subnet=3) as (a, b):
        # A second link between the nodes, another private subnet (the kernel here has no dummy
        # interfaces): it reaches the other node too, but the job was told to meet on the first.
        second = (f"vsx{a.name[-8:]}", f"vsy{a.name[-8:]}")
        subprocess.run(["ip", "link", "add", second[0], "type", "veth", "peer", "name", second[1]], check=True)
        for node, ifname, address in ((a, second[0], "10.78.3.1/24"), (b, second[1], "10.78.3.2/24")):
            subprocess.run(["ip", "link", "set", ifname, "netns", node.name], check=True)
            subprocess.run(["ip", "-n", node.name, "addr", "add", address, "dev", ifname], check=True)
            subprocess.run(["ip", "-n", node.name, "link", "set", ifname, "up"], check=True)
        if backend == "static":
            flags = lambda rank: ["--node-rank", str(rank), "--master-addr", a.addr, "--master-port", "29611"]  # noqa: E731
        else:
            flags = lambda rank: ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{a.addr}:29611"]  # noqa: E731
        procs, found = [], {}
        outs = {n.name: tmp_path / n.name for n in (a, b)}
        for rank, node in enumerate((a, b)):
            outs[node.name].mkdir()
            cmd = [
                sys.executable,
                "-m",
                "shoal",
                "run",
                "--nnodes",
                "2",
                "--nproc",
                "1",
                *flags(rank),
                HOLD,
                str(tmp_path),
            ]
            procs.append((node, node.popen(cmd, env=clean_env(), stderr=subprocess.PIPE, text=True)))
        wait_for(lambda: len(list(tmp_path.glob("ready-*"))) == 2 or any(p.poll() is not None for _, p in procs),
                 timeout=180)  # fmt: skip
        assert all(p.poll() is None for _, p in procs), [p.communicate() for _, p in procs]
        time.sleep(0.5)
        for node, proc in procs:
            found[node.name] = listening(descendants(proc.pid))
        (tmp_path / "done").write_text("")
        errs = {node.name: proc.communicate(timeout=120)[1] for node, proc in procs}
        assert all(proc.returncode == 0 for _, proc in procs), errs
    for node in (a, b):
        addresses = {address for address, _, _ in found[node.name]}
        assert addresses == {node.addr}, (node.name, found[node.name], errs[node.name])
        assert f"listening on {node.addr} only" in errs[node.name]
    assert any(port == 29611 for _, port, _ in found[a.name])  # node a hosts the rendezvous store
