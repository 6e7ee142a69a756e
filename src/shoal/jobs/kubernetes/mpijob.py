"""Kubeflow MPI operator's ``MPIJob`` (kubeflow.org/v2beta1): mpirun in a launcher pod, sshd in the workers.

The operator (kubeflow/mpi-operator, pkg/controller/mpi_job_controller.go, v0.8.2) creates worker
pods ``<name>-worker-<i>`` whose host names resolve as ``<name>-worker-<i>.<name>.<namespace>.svc``,
writes them into the hostfile ``/etc/mpi/hostfile`` (``<host> slots=<slotsPerWorker>``), mounts an
SSH key it generates at ``sshAuthMountPath`` on every pod, and gives the launcher
OMPI_MCA_orte_default_hostfile (that hostfile), OMPI_MCA_orte_keep_fqdn_hostnames and
OMPI_MCA_plm_rsh_args. The launcher runs the mpirun command of :func:`render_mpirun` (the flags of
Horovod's MPI guide) without a host list: mpirun reads the operator's hostfile. Rank 0 runs on
worker 0, so MASTER_ADDR names it. Workers run sshd; the image needs Open MPI and openssh-server
(``shoal launch image --mpi``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from shoal.errors import ShoalError
from shoal.jobs.hosts.options import Here, Host, HostsOptions
from shoal.jobs.hosts.render import render_mpirun
from shoal.jobs.kubernetes import fault_tolerance, template
from shoal.jobs.kubernetes.options import PodOptions, check_job_name
from shoal.jobs.spec import JobSpec

API_VERSION = "kubeflow.org/v2beta1"
SSH_AUTH_MOUNT_PATH = "/root/.ssh"
"""Where the operator mounts the SSH key (its default; the image's ssh runs as root)."""
SSHD = ["/usr/sbin/sshd", "-De"]
"""The workers' command: sshd in the foreground, logging to stderr (the operator's own default)."""
RANK_ENV = ("NCCL_DEBUG", "LD_LIBRARY_PATH", "PATH")
"""Variables mpirun hands every rank (``-x NAME``), as in the MPI operator's Horovod example."""


def worker_hosts(spec: JobSpec, pods: PodOptions) -> tuple[Host, ...]:
    """The hostfile the operator writes: one ``<name>-worker-<i>.<name>.<ns>.svc`` per worker."""
    name, namespace = spec.job_name, pods.namespace
    return tuple(Host(f"{name}-worker-{i}.{name}.{namespace}.svc", spec.local_world_size) for i in range(spec.nodes))


def launcher_command(spec: JobSpec, pods: PodOptions) -> list[str]:
    """The launcher's mpirun: ``spec.nodes`` workers x ``spec.local_world_size`` slots, rank 0 on worker 0."""
    hosts = worker_hosts(spec, pods)
    user_env = [entry["name"] for entry in template.env_entries(spec, pods) if entry["name"] not in RANK_ENV]
    mpirun_spec = dataclasses.replace(
        spec,
        master_addr=hosts[0].name,
        env=tuple((name, None) for name in (*RANK_ENV, *user_env)),
        python="python",
    )
    launcher = Here(is_root=True, cores=1, hostname=f"{spec.job_name}-launcher")
    return render_mpirun(mpirun_spec, HostsOptions(hosts=hosts), launcher, hosts_from_env=True)


def render_mpijob(spec: JobSpec, pods: PodOptions) -> dict[str, Any]:
    """The MPIJob for ``spec`` on ``pods``: ``spec.nodes`` workers with ``spec.local_world_size`` slots each."""
    template.check(spec, pods)
    fault_tolerance.refuse_kind(spec, "an MPIJob")
    name = spec.job_name
    # The operator refuses names whose last worker's host name is no DNS-1035 label (validation.go).
    check_job_name(name, [f"{name}-worker-{spec.nodes - 1}", f"{name}-launcher"])
    if pods.elastic is not None:
        raise ShoalError("--elastic: an MPIJob has a fixed number of workers", "use --kind pytorchjob for --elastic")
    env = template.env_entries(spec, pods)
    if all(entry["name"] != "NCCL_DEBUG" for entry in env):
        env = [{"name": "NCCL_DEBUG", "value": "WARN"}, *env]  # forwarded with -x NCCL_DEBUG
    launcher = template.container(spec, pods, "launcher", launcher_command(spec, pods), env=env, gpus=False)
    launcher.pop("resources", None)  # mpirun alone runs here; the workers get the job's resources
    volumes, mounts = template.volumes(spec, pods)
    worker = template.container(spec, pods, "worker", list(SSHD), mounts=mounts)
    body = {
        "slotsPerWorker": spec.local_world_size,
        "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": spec.max_restarts},
        "sshAuthMountPath": SSH_AUTH_MOUNT_PATH,
        "mpiImplementation": "OpenMPI",
        "mpiReplicaSpecs": {
            "Launcher": {
                "replicas": 1,
                "restartPolicy": "OnFailure",
                "template": template.pod_template(spec, pods, [launcher], []),
            },
            "Worker": {
                "replicas": spec.nodes,
                "restartPolicy": "OnFailure",
                "template": template.pod_template(spec, pods, [worker], volumes),
            },
        },
    }
    return {"apiVersion": API_VERSION, "kind": "MPIJob", "metadata": template.metadata(spec, pods), "spec": body}
