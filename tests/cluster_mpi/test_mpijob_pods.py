"""An MPIJob, end to end: the manifest shoal renders, the pods the MPI operator makes of it, real SSH.

``shoal launch k8s --kind mpijob`` renders the MPIJob; it is checked against the MPI operator's CRD;
:mod:`k8s.sim_mpijob` computes the pods the operator (kubeflow/mpi-operator v0.8.2) would create:
launcher and workers with their host names, the hostfile, the SSH secret and the OMPI_MCA_*
variables. Each pod then runs as a network namespace (:mod:`cluster.pods`) whose peers resolve its
names (``<job>-worker-<i>.<job>.<ns>.svc``), with the operator's volumes mounted where the operator
mounts them (the key at /root/.ssh, the hostfile at /etc/mpi, the claim at /shared, a tmpfs
/dev/shm). Every worker runs a real sshd (its command from the manifest, with a configuration of the
test's); the launcher runs the manifest's command as is: Open MPI's mpirun reaches the workers over
SSH with the mounted key and the operator's hostfile, and every rank trains.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from cluster.pods import left_behind, pods_unavailable
from cluster.sshd import ssh_keypair, sshd_unavailable, start_sshd
from k8s import sim_mpijob
from k8s.crd_schema import assert_valid
from k8s.pod_runtime import MPI_IMAGE_FILES, container_env, run_pods
from shoal.jobs.kubernetes.mpijob import render_mpijob
from shoal.jobs.kubernetes.options import PodOptions, VolumeClaim
from shoal.jobs.spec import JobSpec

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed (openmpi-bin)"),
]
HVD_SCRIPT = str(Path(__file__).parent / "scripts" / "hvd_digits.py")
NAMESPACE = "team"
SHARED = "/mnt/shared"
"""Where the claim is mounted in the pods (a new top-level directory cannot be made: see cluster.pods)."""


@pytest.fixture
def can_make_pods():
    reason = pods_unavailable() or sshd_unavailable()
    if reason:
        pytest.skip(reason)


def _run_mpijob(
    tmp_path: Path,
    name: str,
    command: tuple[str, ...],
    workers: int = 2,
    sshd_late_s: float = 0.0,
    env: tuple[tuple[str, str | None], ...] = (),
    manifest: dict | None = None,
) -> tuple[int, str, Path, sim_mpijob.MPIJobPods]:
    """Render, validate, simulate and run an MPIJob: (launcher exit status, its output, the claim, pods).

    ``sshd_late_s``: start the workers' sshd this long after the launcher, as when the launcher pod
    comes up first; the operator's ``OMPI_MCA_plm_rsh_args=-o ConnectionAttempts=10`` bridges it.
    ``env``: ``shoal launch k8s --env`` (the launcher's container, handed on by mpirun ``-x``).
    ``manifest``: the MPIJob as rendered elsewhere (``shoal launch k8s --dry-run``'s), instead of
    rendering ``command`` here; its name, namespace and claim as here.
    """
    if manifest is None:
        spec = JobSpec(command=command, job_name=name, nodes=workers, nproc=1, env=env)
        manifest = render_mpijob(
            spec, PodOptions(image="shoal:test", namespace=NAMESPACE, volumes=(VolumeClaim("shared", SHARED),))
        )
    assert_valid(manifest)
    # The operator's SSH Secret (newSSHAuthSecret): a key pair it generates, here made by the test.
    key = ssh_keypair(tmp_path / "operator-key")
    secrets = {f"{name}-ssh": {"ssh-privatekey": key.private.read_text(), "ssh-publickey": key.public.read_text()}}
    job = sim_mpijob.simulate(manifest, secrets=secrets)
    assert job.hostfile == "".join(f"{name}-worker-{i}.{name}.{NAMESPACE}.svc slots=1\n" for i in range(workers))
    shared = tmp_path / "pvc"
    shared.mkdir()
    pods_dir = tmp_path / "pods"
    with run_pods(job.pods, pods_dir, claims={"shared": shared}, secrets=secrets, image_files=MPI_IMAGE_FILES) as net:
        ssh_dir = manifest["spec"]["sshAuthMountPath"]
        servers = [
            start_sshd(
                net[w.name], tmp_path / f"sshd-{w.name}", argv=w.argv, authorized_keys=f"{ssh_dir}/authorized_keys"
            )
            for w in job.workers
        ]
        launcher = net[job.launcher.name]
        log = tmp_path / "launcher.log"
        with open(log, "w") as out:
            proc = launcher.popen(
                job.launcher.argv, env=container_env(job.launcher), stdout=out, stderr=subprocess.STDOUT, cwd="/"
            )
            try:
                status = proc.wait(timeout=420)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise AssertionError(f"the launcher's mpirun still runs after 420 s:\n{log.read_text()}") from None
        accepted = [server.accepted() for server in servers]
        left = left_behind([net[job.launcher.name]])
    output = log.read_text(errors="replace")
    assert not left, f"processes left in the launcher pod after mpirun: {left}\n{output}"
    for logins, worker in zip(accepted, job.workers):
        assert any(f"from {launcher.addr}" in line for line in logins), f"{worker.name}: no SSH login from the launcher"
    return status, output, shared, job


def test_mpijob_trains_digits_across_worker_pods_over_real_ssh(tmp_path, can_make_pods):
    command = ("shoal", "train", "digits", "--epochs", "2", "--device", "cpu", "--out", f"{SHARED}/run")
    status, output, shared, job = _run_mpijob(tmp_path, "digits", command)
    assert status == 0, output  # mpirun exits 0 only when every rank did
    config = json.loads((shared / "run" / "config.json").read_text())
    facts = {**config, **config.get("extra", {})}
    assert (facts["environment"], facts["world_size"]) == ("openmpi", 2)
    assert len((shared / "run" / "metrics.jsonl").read_text().splitlines()) == 2  # both epochs, on the claim
    assert job.launcher.argv[:3] == ["mpirun", "-np", "2"]


def test_mpijob_runs_a_horovod_style_script(tmp_path, can_make_pods):
    # The launcher first, the workers' sshd 2 s later: mpirun's ssh retries (ConnectionAttempts=10).
    status, output, shared, job = _run_mpijob(tmp_path, "hvd", ("python", HVD_SCRIPT, SHARED), sshd_late_s=2.0)
    assert status == 0, output
    ranks = [json.loads((shared / f"hvd-rank{r}.json").read_text()) for r in range(2)]
    assert [(r["rank"], r["size"], r["local_rank"]) for r in ranks] == [(0, 2, 0), (1, 2, 0)]
    assert [r["host"] for r in ranks] == [w.hostname for w in job.workers]  # one rank in each worker pod
    assert ranks[0]["weights_sum"] == ranks[1]["weights_sum"]  # broadcast + averaged gradients: one model
    state = torch.load(shared / "hvd-checkpoint.pt", weights_only=True)
    assert set(state) == {"0.weight", "0.bias", "2.weight", "2.bias"}


def test_an_mpijob_gives_a_torchrun_script_torchruns_contract(tmp_path, can_make_pods):
    """The launcher's mpirun runs each rank through the shim: one rank in each worker pod."""
    from contract.torchrun import SCRIPT, check_report, report_from_file

    status, output, shared, job = _run_mpijob(tmp_path, "contract", ("python", str(SCRIPT), f"{SHARED}/contract.json"))
    assert status == 0, output
    ranks = check_report(report_from_file(shared / "contract.json"), world=2, nodes=2)
    assert [(v["GROUP_RANK"], v["LOCAL_RANK"], v["LOCAL_WORLD_SIZE"]) for v in ranks] == [
        ("0", "0", "1"),
        ("1", "0", "1"),
    ]
    assert {v["MASTER_ADDR"] for v in ranks} == {f"{job.workers[0].hostname}.contract.{NAMESPACE}.svc"}  # worker 0


def test_an_mpijob_with_shoal_tf_config_gives_every_rank_tf_config(tmp_path, can_make_pods):
    """``--env SHOAL_TF_CONFIG=1`` on an MPIJob: the launcher's plain mpirun runs each rank through
    the shim, rank 0's shim serves the exchange; each rank advertises its own worker pod's address."""
    from launch.tf_config_checks import PRINT, check_tf_config, tf_config_reports

    command = ("python", str(PRINT), SHARED)
    status, output, shared, job = _run_mpijob(tmp_path, "tfconfig", command, env=(("SHOAL_TF_CONFIG", "1"),))
    assert status == 0, output
    hosts = check_tf_config(tf_config_reports(shared, 2), 2)
    assert hosts[0] != hosts[1] and all(host.startswith("10.77.") for host in hosts), hosts  # one per pod
