"""``shoal doctor`` across nodes: network-namespace pods on one bridge (tests/cluster/pods.py), one
process each, and faults injected with the real tools: tc's token bucket filter on one node's link,
an nftables rule dropping the rendezvous port on one node, a host name mapped to 127.0.1.1, a 1 MB
tmpfs as /dev/shm, a checkpoint directory that is not the shared one, a second virtual environment
with another shoal version. Each fault is found, named (node and host), with its HINT; a healthy
cluster passes every check; nothing hangs (every run is bounded by the test's own deadline).
"""

from __future__ import annotations

import shutil
import sys

import jsonschema
import pytest
from doctor_pods import describe, other_shoal, start, wait

from cluster.pods import Mount, PodSpec, pod_network, pods_unavailable
from shoal.doctor.report import render_cluster
from shoal.doctor.schema import SCHEMA

pytestmark = pytest.mark.multiprocess

PORT = 29500
OTHER_VERSION = "0.0.1.dev7"


@pytest.fixture(autouse=True)
def _need_pods():
    reason = pods_unavailable()
    if reason:
        pytest.skip(reason)


def _specs(n: int, **extra: dict) -> list[PodSpec]:
    names = {f"n{j}": f"n{j}" for j in range(n)}
    return [PodSpec(f"n{i}", resolves=names, **extra.get(f"n{i}", {})) for i in range(n)]


def _doctor_args(n: int, i: int, checkpoint_dir, *more: str) -> list[str]:
    return [
        "doctor", "--nnodes", str(n), "--node-rank", str(i), "--master-addr", "n0", "--master-port", str(PORT),
        "--checkpoint-dir", str(checkpoint_dir), *more,
    ]  # fmt: skip


def _checks(checks: list[dict]) -> dict[str, dict]:
    return {c["name"]: c for c in checks}


def _healthy_run(tmp_path, attempt: int) -> str:
    """``shoal run`` of ``shoal doctor`` on 3 healthy pods: rank 0's report (every node exits 0)."""
    shared = tmp_path / "ckpt"
    shared.mkdir(exist_ok=True)
    launch = ["run", "--nnodes", "3", "--nproc", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"n0:{PORT}"]
    doctor = ["-m", "shoal", "doctor", "--checkpoint-dir", str(shared)]
    with pod_network(_specs(3), tag=f"dh{attempt}") as net:
        runs = [start(pod, [*launch, "--join-timeout", "120", *doctor], tmp_path / f"logs{attempt}") for pod in net]
        wait(runs, 300)
    assert [run.proc.returncode for run in runs] == [0, 0, 0], describe(runs)
    (report,) = [run.stdout for run in runs if "shoal doctor:" in run.stdout]  # whichever node got rank 0
    return report


def _only_a_bandwidth_warning(report: str) -> bool:
    """The report's one finding is a slow link (a warning, not a failure)."""
    findings = [line.split()[:2] for line in report.splitlines() if line.strip().startswith(("warn ", "fail "))]
    return findings == [["warn", "bandwidth"]] and report.splitlines()[-1].startswith("shoal doctor: warnings only")


def test_a_healthy_cluster_passes_every_check_under_shoal_run(tmp_path):
    """Every check passes. One exception is tolerated once: the suite runs beside another test file on
    the same 2 cores, and a burst of its CPU work (a few interpreters importing torch) can starve one
    direction of a veth link through both probe passes and the confirmation (seen once in a full run:
    206 MB/s against a median of 1,099 MB/s). The doctor is right to warn then (its HINT names "a CPU
    too busy to feed it"); the cluster is measured once more, and that run must pass every check."""
    report = _healthy_run(tmp_path, 0)
    if _only_a_bandwidth_warning(report):
        report = _healthy_run(tmp_path, 1)
    shared = tmp_path / "ckpt"
    lines = report.splitlines()
    assert lines[0].startswith("shoal doctor: 3 node(s), 3 ranks (torchrun, master "), report
    assert lines[-1].startswith("shoal doctor: all checks pass ("), report
    for i in range(3):
        assert any(line.startswith(f"  ok    node {i} (n{i})  10.77.") for line in lines), report
    for name in ("arrivals", "versions", "latency", "bandwidth", "allreduce", "storage"):
        assert any(line.split()[:2] == ["ok", name] for line in lines), report
    assert "storage    all 3 node(s) read the token rank 0 wrote to " + str(shared) in report
    links = lines[lines.index("links (MB/s each way, round trip):") + 1 : -1]
    assert [row.split()[:7] for row in links] == [  # every pair of nodes
        ["node", "0", "(n0)", "-", "node", "1", "(n1)"],
        ["node", "0", "(n0)", "-", "node", "2", "(n2)"],
        ["node", "1", "(n1)", "-", "node", "2", "(n2)"],
    ]
    assert not list(shared.iterdir())  # the token is gone


def test_a_slow_sender_among_three_nodes_is_named(tmp_path):
    """Issue 22: node 2's egress at 20 Mbit/s sits on two of the three links, so the median link is
    its own; the old verdict said "ok  bandwidth  3 link(s): median 2.4 MB/s". Judged by its own
    links against the others' and on the absolute scale, it is named, and so is the all-reduce."""
    shared = tmp_path / "ckpt"
    shared.mkdir()
    with pod_network(_specs(3), tag="ds") as net:
        net.limit_rate(net["n2"], "20mbit", direction="egress")
        runs = [
            start(pod, _doctor_args(3, i, shared, "--join-timeout", "120"), tmp_path / "logs")
            for i, pod in enumerate(net)
        ]
        wait(runs, 300)
    assert [run.proc.returncode for run in runs] == [1, 0, 0], describe(runs)
    text = runs[0].stdout
    (bandwidth,) = [line for line in text.splitlines() if line.split()[:2] == ["fail", "bandwidth"]]
    assert bandwidth.strip().startswith("fail  bandwidth  node 2 (n2) is slow: "), text
    assert "on all its 2 links (it sends slowly; " in bandwidth and "per step at that rate" in bandwidth, text
    (allreduce,) = [line for line in text.splitlines() if line.split()[1:2] == ["allreduce"]]
    assert allreduce.split()[0] == "fail" and "held back by node 2 (n2)" in allreduce, text


@pytest.fixture(scope="module")
def other_python(tmp_path_factory) -> str:
    return other_shoal(tmp_path_factory.mktemp("other-shoal"), OTHER_VERSION)


@pytest.mark.slow
def test_each_injected_fault_is_found_and_named_with_its_hint(tmp_path, other_python):
    shared, private = tmp_path / "ckpt", tmp_path / "elsewhere"
    shared.mkdir()
    private.mkdir()
    specs = _specs(
        6,
        n2={"own_address": "127.0.1.1"},  # Debian's default /etc/hosts line for the host's own name
        n3={"mounts": [Mount("/dev/shm", None, size="1m")]},
        n4={"mounts": [Mount(str(shared), str(private))]},  # its "shared" directory is its own
    )
    with pod_network(specs, tag="df") as net:
        net.limit_rate(net["n1"], "20mbit")  # the others' links are virtual Ethernet: GB/s
        runs = [
            start(
                pod,
                _doctor_args(6, i, shared, "--join-timeout", "120", "--json"),
                tmp_path / "logs",
                python=other_python if pod.name == "n5" else sys.executable,
            )
            for i, pod in enumerate(net)
        ]
        wait(runs, 360)
    assert [run.proc.returncode for run in runs] == [1, 0, 0, 0, 0, 0], describe(runs)
    document = runs[0].report()
    jsonschema.validate(document, SCHEMA)
    assert document["status"] == "fail" and document["cluster"]["nodes"] == 6
    nodes = {node["node_rank"]: _checks(node["checks"]) for node in document["nodes"]}
    cluster = _checks(document["cluster"]["checks"])

    assert {c["status"] for i in (0, 1, 4, 5) for c in nodes[i].values()} == {"ok"}, nodes  # per-node: all fine
    assert nodes[2]["hostname"]["status"] == "warn"
    assert nodes[2]["hostname"]["summary"].startswith("n2 resolves to 127.0.1.1 (loopback) here")
    assert "map n2 to this node's own address in /etc/hosts" in nodes[2]["hostname"]["hint"]
    assert nodes[3]["shm"]["status"] == "fail" and nodes[3]["shm"]["summary"].startswith("/dev/shm is 1 MiB")
    assert "--shm-size" in nodes[3]["shm"]["hint"]
    assert [name for name, c in nodes[2].items() if c["status"] != "ok"] == ["hostname"]
    assert [name for name, c in nodes[3].items() if c["status"] != "ok"] == ["shm"]

    bandwidth = cluster["bandwidth"]
    assert bandwidth["status"] == "fail" and bandwidth["data"]["slow_nodes"] == ["node 1 (n1)"], bandwidth
    assert bandwidth["summary"].startswith("node 1 (n1) is slow: ") and "on all its 5 links" in bandwidth["summary"]
    assert "tc qdisc show" in bandwidth["hint"]
    # 20 Mbit/s costs a ResNet-18 gradient all-reduce tens of seconds a step: a fail on the absolute scale.
    assert "held back by node 1 (n1)" in cluster["allreduce"]["summary"] and cluster["allreduce"]["status"] == "fail"
    assert "ResNet-18 gradient all-reduce (44.7 MB, 6 ranks) takes ~" in cluster["allreduce"]["summary"]
    slow = {tuple(sorted(link["hosts"])) for link in document["cluster"]["links"] if link["status"] != "ok"}
    assert slow == {tuple(sorted(("node 1 (n1)", f"node {i} (n{i})"))) for i in (0, 2, 3, 4, 5)}

    storage = cluster["storage"]
    assert storage["status"] == "fail", storage
    assert storage["summary"].startswith("1 of 6 node(s) do not see rank 0's token: node 4 (n4): "), storage
    assert "does not exist on this node" in storage["summary"] and "same shared file system" in storage["hint"]

    versions = cluster["versions"]
    assert versions["status"] == "fail"
    assert versions["summary"] == f"shoal differs: node 5 (n5): {OTHER_VERSION}; 0.1.0 on the other 5 node(s)"
    assert "install the same versions on every node" in versions["hint"]
    assert (cluster["arrivals"]["status"], cluster["latency"]["status"]) == ("ok", "ok")

    text = render_cluster(document)  # what the same run prints without --json
    assert "  fail  bandwidth  node 1 (n1) is slow: " in text and "HINT: look at that node's network" in text
    assert text.splitlines()[-1].startswith("shoal doctor: FAILED (")


RULES = """table inet shoal_doctor_test {{
  chain out {{
    type filter hook output priority 0;
    tcp dport {port} drop
  }}
}}
"""


DROPPED_JOIN_S = 10
"""The others' wait for n2: n2's own verdict takes one port probe (shoal.doctor.network.PORT_PROBE_S, 3 s)
after its start, the others give up ~3 s before their join timeout; 10 leaves seconds between the two
(15 was 12 s of wall for 0.6 CPU-s)."""


@pytest.mark.skipif(shutil.which("nft") is None, reason="nftables is not installed (scripts/install-system-deps.sh)")
def test_a_dropped_rendezvous_port_is_named_by_the_node_behind_it(tmp_path):
    shared = tmp_path / "ckpt"
    shared.mkdir()
    with pod_network(_specs(3), tag="dn") as net:
        net["n2"].run(["nft", "-f", "-"], input=RULES.format(port=PORT), text=True, check=True)  # n2 -> *:29500 dropped
        runs = [
            start(pod, _doctor_args(3, i, shared, "--join-timeout", str(DROPPED_JOIN_S)), tmp_path / "logs")
            for i, pod in enumerate(net)
        ]
        wait(runs, 240)
        master, blocked = net["n0"].addr, net["n2"].addr
    n0, n1, n2 = runs
    assert n2.proc.returncode == 1, describe(runs)
    assert n2.ended < n0.ended and n2.ended < n1.ended  # it said so at once, it did not wait for the rendezvous
    row = next(line for line in n2.stdout.splitlines() if line.split()[:2] == ["fail", "master-port"])
    assert f"port {PORT} of {master} does not answer from n2 ({blocked}) (timeout) while port {PORT + 1} does" in row
    assert f"a firewall drops port {PORT}" in row
    assert f"HINT: allow TCP port {PORT} from this node to the master" in n2.stdout
    assert "shoal doctor: this node cannot join the job (master-port failed): not starting it" in n2.stderr
    for run in (n0, n1):  # the others give up after the join timeout, and say where to look
        assert run.proc.returncode not in (0, None), describe(runs)
        assert f"run `shoal doctor --master n0:{PORT}` on the missing node(s)" in run.stderr, describe(runs)
    assert "only 2 of 3 nodes arrived at the static rendezvous" in n0.stderr, describe(runs)


@pytest.mark.slow
def test_sixteen_nodes_complete(tmp_path):
    shared = tmp_path / "ckpt"
    shared.mkdir()
    with pod_network(_specs(16), tag="d16") as net:
        runs = [
            start(pod, _doctor_args(16, i, shared, "--join-timeout", "240", "--json"), tmp_path / "logs")
            for i, pod in enumerate(net)
        ]
        wait(runs, 480)
    assert [run.proc.returncode for run in runs] == [0] * 16, describe(runs)
    document = runs[0].report()
    jsonschema.validate(document, SCHEMA)
    assert document["cluster"]["nodes"] == 16 and len(document["cluster"]["links"]) == 16 * 15 // 2
    assert {c["status"] for c in document["cluster"]["checks"]} <= {"ok", "warn"}, document["cluster"]["checks"]
    assert {node["host"] for node in document["nodes"]} == {f"n{i}" for i in range(16)}
    print(f"16 nodes: shoal doctor took {document['cluster']['elapsed_s']} s from init to the report")
