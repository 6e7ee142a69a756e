"""TF_CONFIG on every path that starts workers, checked cheaply: a script that only reports what it got
(tests/launch/scripts/tf_config_print.py: no torch, no TF) under mpirun's shim (``shoal launch --via
mpirun`` across two namespace nodes over real SSH), one ``shoal run`` per node (``--via ssh``), and
``shoal run`` in PyTorchJob and TrainJob pods (the operators' variables); srun's shim in
test_tf_config_slurm.py, MPIJob pods in tests/cluster_mpi/test_mpijob_pods.py
(a file of its own: the Slurm cluster's tests run together, on one worker). On each: one list for every rank, indexes = ranks, every ``host:port``
distinct, every port free for TF to bind, every address the node's own on the job's network. The
Keras ``fit`` itself runs in test_tf_config.py.
"""

from __future__ import annotations

import shutil

import pytest
from tf_config_checks import PRINT, check_tf_config, tf_config_reports

# The namespace nodes with a real sshd of test_launch_real_ssh (node0 runs shoal launch, node1 is
# reached over SSH) and its way of launching there.
from cluster_mpi.test_launch_real_ssh import _launch, cluster  # noqa: F401

pytestmark = pytest.mark.multiprocess


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
    hosts = check_tf_config(tf_config_reports(tmp_path, 3), 3)
    assert hosts == [net["node0"].addr, net["node0"].addr, net["node1"].addr]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_operator_pods_give_every_worker_tf_config(tmp_path, kind):
    """2 pods x 1 worker, each pod's ``shoal run`` from the manifest, under the operator's variables
    (PyTorchJob: training-operator's; TrainJob: Trainer v2's PET_*): the workers exchange through the
    workers' store the agents serve, and each advertises its pod's own address. (Two workers of one
    node getting distinct ports is proven on the ``--via ssh`` path above: node0:2.)"""
    from cluster.pods import pods_unavailable
    from k8s import sim_pytorchjob, sim_trainjob
    from k8s.test_job_pods import RUNTIME, SHARED, _run, _show
    from shoal.jobs.kubernetes.options import PodOptions, VolumeClaim
    from shoal.jobs.kubernetes.pytorchjob import render_pytorchjob
    from shoal.jobs.kubernetes.trainjob import render_trainjob
    from shoal.jobs.spec import JobSpec

    reason = pods_unavailable()
    if reason:
        pytest.skip(reason)
    spec = JobSpec(command=(str(PRINT), SHARED), job_name="tfconfig", nodes=2, nproc=1, env=(("SHOAL_TF_CONFIG", "1"),))
    pods = PodOptions(image="shoal:test", namespace="team", volumes=(VolumeClaim("shared", SHARED),))
    if kind == "pytorchjob":
        sim = sim_pytorchjob.simulate(render_pytorchjob(spec, pods))
    else:
        sim = sim_trainjob.simulate(render_trainjob(spec, pods), RUNTIME)
    codes, outputs, shared, _ = _run(tmp_path, sim)
    assert set(codes.values()) == {0}, _show(outputs)
    reports = tf_config_reports(shared, 2)
    hosts = check_tf_config(reports, 2)
    assert [r["GROUP_RANK"] for r in reports] == ["0", "1"]
    assert hosts[0] != hosts[1], hosts  # one address per pod
    assert all(host.startswith("10.77.") for host in hosts)  # the pods' network, never loopback


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is missing")
def test_the_hand_typed_mpirun_line_of_the_docs_gives_each_rank_tf_config(tmp_path):
    """docs/LAUNCHERS.md's own mpirun line (with --allow-run-as-root, as root): SHOAL_TF_CONFIG named
    with -x, each rank's shim in front of the script; rank 0's shim serves the exchange."""
    import os
    import subprocess
    import sys

    from shoal.launch.ports import find_free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "SLURM_"))}
    env.update(SHOAL_TF_CONFIG="1", PATH=os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")]))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG", "SHOAL_ENV"):
        env.pop(name, None)
    argv = [
        "mpirun", "-np", "2", "--allow-run-as-root", "--oversubscribe", "-x", "SHOAL_TF_CONFIG",
        "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={find_free_port()}", "-x", "PATH",
        "python", "-m", "shoal.launch.as_torchrun", "--", "python", str(PRINT), str(tmp_path),
    ]  # fmt: skip
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert check_tf_config(tf_config_reports(tmp_path, 2), 2) == ["127.0.0.1", "127.0.0.1"]
