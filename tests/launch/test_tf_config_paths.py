"""TF_CONFIG on every path that starts workers, checked cheaply: a script that only reports what it got
(tests/launch/scripts/tf_config_print.py: no torch, no TF) under mpirun's shim (``shoal launch --via
mpirun`` across two namespace nodes over real SSH), one ``shoal run`` per node (``--via ssh``), and
``shoal run`` in PyTorchJob pods (the operator's variables); srun's shim in test_tf_config_slurm.py
(a file of its own: the Slurm cluster's tests run together, on one worker). On each: one list for every rank, indexes = ranks, every ``host:port``
distinct, every port free for TF to bind, every address the node's own on the job's network. The
Keras ``fit`` itself runs in test_tf_config.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

# The namespace nodes with a real sshd of test_launch_real_ssh (node0 runs shoal launch, node1 is
# reached over SSH) and its way of launching there.
from cluster_mpi.test_launch_real_ssh import _launch, cluster  # noqa: F401

pytestmark = pytest.mark.multiprocess

PRINT = Path(__file__).parent / "scripts" / "tf_config_print.py"


def _reports(directory: Path, world: int) -> list[dict]:
    found = sorted(directory.glob("rank*.json"))
    assert len(found) == world, [p.name for p in found]
    return sorted((json.loads(p.read_text()) for p in found), key=lambda r: int(r["RANK"]))


def _check(reports: list[dict], world: int) -> list[str]:
    """Every rank's TF_CONFIG agrees and matches its rank; returns the workers' hosts in rank order."""
    workers = reports[0]["tf_config"]["cluster"]["worker"]
    assert len(workers) == world and len(set(workers)) == world, workers
    for rank, report in enumerate(reports):
        assert report["tf_config"] == {"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}}
        assert report["bindable"], f"rank {rank}: its port was not free for TF: {workers[rank]}"
        assert report["SHOAL_TF_CONFIG"] is None  # the opt-in is not handed on to the script
    return [worker.rpartition(":")[0] for worker in workers]


@pytest.mark.slow
@pytest.mark.parametrize(
    "via",
    [
        "ssh",
        pytest.param(
            "mpirun", marks=pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is missing")
        ),
    ],
)
def test_shoal_launch_across_namespace_nodes_gives_each_rank_tf_config(cluster, tmp_path, via):  # noqa: F811 (the fixture)
    """node0:2,node1:1: under mpirun rank 0's shim serves the exchange to node1 over the bridge; over
    SSH the per-node ``shoal run`` agents' workers' store does. Each node advertises its own address."""
    net, _ = cluster
    args = ["--hosts", "node0:2,node1:1", "--via", via, "--env", "SHOAL_TF_CONFIG=1", "--", str(PRINT), str(tmp_path)]
    proc, _ = _launch(net, args, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hosts = _check(_reports(tmp_path, 3), 3)
    assert hosts == [net["node0"].addr, net["node0"].addr, net["node1"].addr]


@pytest.mark.slow
def test_pytorchjob_pods_give_every_worker_tf_config(tmp_path):
    """2 pods x 2 workers, each pod's ``shoal run`` from the manifest: the workers exchange through the
    workers' store the agents serve; each pod's workers advertise the pod's own address."""
    from cluster.pods import pods_unavailable
    from k8s import sim_pytorchjob
    from k8s.test_job_pods import SHARED, _run, _show
    from shoal.jobs.kubernetes.options import PodOptions, VolumeClaim
    from shoal.jobs.kubernetes.pytorchjob import render_pytorchjob
    from shoal.jobs.spec import JobSpec

    reason = pods_unavailable()
    if reason:
        pytest.skip(reason)
    spec = JobSpec(command=(str(PRINT), SHARED), job_name="tfconfig", nodes=2, nproc=2, env=(("SHOAL_TF_CONFIG", "1"),))
    pods = PodOptions(image="shoal:test", namespace="team", volumes=(VolumeClaim("shared", SHARED),))
    sim = sim_pytorchjob.simulate(render_pytorchjob(spec, pods))
    codes, outputs, shared, _ = _run(tmp_path, sim)
    assert set(codes.values()) == {0}, _show(outputs)
    reports = _reports(shared, 4)
    hosts = _check(reports, 4)
    nodes = [r["GROUP_RANK"] for r in reports]
    assert nodes == ["0", "0", "1", "1"]
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3]  # one address per pod
    assert all(host.startswith("10.77.") for host in hosts)  # the pods' network, never loopback
