"""The pods the Kubeflow MPI operator creates for an MPIJob (kubeflow.org/v2beta1).

Rules, from kubeflow/mpi-operator at commit caa3c47 (v0.8.2, the CRD's commit):

- admission: pkg/apis/kubeflow/v2beta1/default.go (slotsPerWorker 1, sshAuthMountPath /root/.ssh,
  mpiImplementation OpenMPI, launcher restartPolicy OnFailure, worker Never) and
  pkg/apis/kubeflow/validation/validation.go (the last worker's host name ``<name>-worker-<n-1>`` a
  DNS-1035 label, one launcher, at least one worker, restartPolicy Never or OnFailure, containers);
- pods (pkg/controller/mpi_job_controller.go): workers ``<name>-worker-<i>`` with that hostname,
  subdomain ``<name>`` (the job's headless Service, selecting launcher and workers) and an extra DNS
  search ``<name>.<ns>.svc.cluster.local``, the first container running ``/usr/sbin/sshd -De`` when
  the template gives no command; the launcher a batch Job ``<name>-launcher`` whose pod has hostname
  ``<name>-launcher`` and the same subdomain;
- the hostfile (``newConfigMap``): ``<name>-worker-<i>.<name>.<ns>.svc slots=<slotsPerWorker>`` per
  worker (``.<cluster-domain>`` appended when the operator runs with ``--cluster-domain``), mounted
  with discover_hosts.sh at /etc/mpi on the launcher;
- SSH (``newSSHAuthSecret``, ``setupSSHOnPod``): a generated key in Secret ``<name>-ssh`` mounted at
  sshAuthMountPath on the launcher and every worker as id_rsa, id_rsa.pub and authorized_keys
  (mode 0600 under /root/.ssh);
- environment: K_MPI_JOB_ROLE on both; on the launcher OMPI_MCA_orte_keep_fqdn_hostnames=true,
  OMPI_MCA_orte_default_hostfile=/etc/mpi/hostfile, OMPI_MCA_plm_rsh_args="-o
  ConnectionAttempts=10", OMPI_MCA_orte_set_default_slots=<slots>, and NVIDIA_VISIBLE_DEVICES and
  NVIDIA_DRIVER_CAPABILITIES set empty (no GPU for mpirun).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from k8s.sim_cluster import CLUSTER_DOMAIN, SimPod, SimulationError, is_dns1035_label, start_pod

CONFIG_MOUNT = "/etc/mpi"
HOSTFILE = f"{CONFIG_MOUNT}/hostfile"
SSHD = ["/usr/sbin/sshd", "-De"]


@dataclass
class MPIJobPods:
    launcher: SimPod
    workers: list[SimPod]
    hostfile: str
    """The hostfile's text, as the launcher reads it at /etc/mpi/hostfile."""
    ssh_secret: str
    """The Secret (``<name>-ssh``) the operator generates: keys ssh-privatekey and ssh-publickey."""

    @property
    def pods(self) -> list[SimPod]:
        return [self.launcher, *self.workers]


def admit(job: Mapping[str, Any]) -> dict[str, Any]:
    job = copy.deepcopy(dict(job))
    spec = job["spec"]
    spec.setdefault("runPolicy", {}).setdefault("cleanPodPolicy", "None")
    spec.setdefault("slotsPerWorker", 1)
    spec["sshAuthMountPath"] = spec.get("sshAuthMountPath") or "/root/.ssh"
    spec.setdefault("mpiImplementation", "OpenMPI")
    spec.setdefault("launcherCreationPolicy", "AtStartup")
    replicas = spec.get("mpiReplicaSpecs", {})
    if "Launcher" in replicas:
        replicas["Launcher"].setdefault("restartPolicy", "OnFailure")
        replicas["Launcher"].setdefault("replicas", 1)
    if "Worker" in replicas:
        replicas["Worker"].setdefault("restartPolicy", "Never")
        replicas["Worker"].setdefault("replicas", 0)
    # validation.go
    workers = replicas.get("Worker", {}).get("replicas") or 1
    last = f"{job['metadata']['name']}-worker-{workers - 1}"
    if not is_dns1035_label(last):
        raise SimulationError(f"metadata.name: will not able to create pod and service with invalid DNS label {last!r}")
    if "Launcher" not in replicas:
        raise SimulationError("spec.mpiReplicaSpecs[Launcher]: must have Launcher replica spec")
    if replicas["Launcher"]["replicas"] != 1:
        raise SimulationError("spec.mpiReplicaSpecs[Launcher].replicas: must be 1")
    if "Worker" in replicas and replicas["Worker"]["replicas"] <= 0:
        raise SimulationError("spec.mpiReplicaSpecs[Worker].replicas: must be greater than or equal to 1")
    for kind, replica in replicas.items():
        if replica["restartPolicy"] not in ("Never", "OnFailure"):
            raise SimulationError(f"spec.mpiReplicaSpecs[{kind}].restartPolicy: {replica['restartPolicy']!r}")
        if not replica["template"]["spec"].get("containers"):
            raise SimulationError(f"spec.mpiReplicaSpecs[{kind}]: must define at least one container")
    if spec["slotsPerWorker"] < 0:
        raise SimulationError("spec.slotsPerWorker: must be greater than or equal to 0")
    if spec["runPolicy"]["cleanPodPolicy"] not in ("None", "Running", "All"):
        raise SimulationError(f"spec.runPolicy.cleanPodPolicy: {spec['runPolicy']['cleanPodPolicy']!r}")
    return job


def hostfile(job: Mapping[str, Any], cluster_domain: str = "") -> str:
    name, namespace = job["metadata"]["name"], job["metadata"].get("namespace", "default")
    slots = job["spec"].get("slotsPerWorker", 1)
    suffix = f".{cluster_domain}" if cluster_domain else ""
    workers = job["spec"]["mpiReplicaSpecs"].get("Worker", {}).get("replicas", 0)
    return "".join(f"{name}-worker-{i}.{name}.{namespace}.svc{suffix} slots={slots}\n" for i in range(workers))


def simulate(
    job: Mapping[str, Any],
    *,
    secrets: Mapping[str, Mapping[str, str]] | None = None,
    cluster_domain: str = "",
) -> MPIJobPods:
    """The launcher and worker pods of ``job``; ``cluster_domain`` as the operator's flag."""
    job = admit(job)
    name, namespace = job["metadata"]["name"], job["metadata"].get("namespace", "default")
    spec = job["spec"]
    slots = str(spec["slotsPerWorker"])
    hosts = hostfile(job, cluster_domain)
    workers_n = spec["mpiReplicaSpecs"].get("Worker", {}).get("replicas", 0)
    discover = "#!/bin/sh\n" + "".join(f"echo {name}-worker-{i}.{name}.{namespace}.svc\n" for i in range(workers_n))
    ssh_volume = {
        "name": "ssh-auth",
        "secret": {
            "secretName": f"{name}-ssh",
            "items": [
                {"key": "ssh-privatekey", "path": "id_rsa"},
                {"key": "ssh-publickey", "path": "id_rsa.pub"},
                {"key": "ssh-publickey", "path": "authorized_keys"},
            ],
            **({"defaultMode": 0o600} if spec["sshAuthMountPath"] == "/root/.ssh" else {}),
        },
    }
    ssh_mount = {"name": "ssh-auth", "mountPath": spec["sshAuthMountPath"]}
    launcher_env = [
        {"name": "K_MPI_JOB_ROLE", "value": "launcher"},
        {"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "true"},
        {"name": "OMPI_MCA_orte_default_hostfile", "value": HOSTFILE},
        {"name": "OMPI_MCA_plm_rsh_args", "value": "-o ConnectionAttempts=10"},
        {"name": "OMPI_MCA_orte_set_default_slots", "value": slots},
        {"name": "NVIDIA_VISIBLE_DEVICES"},
        {"name": "NVIDIA_DRIVER_CAPABILITIES"},
    ]
    config_volume = {
        "name": "mpi-job-config",
        "configMap": {
            "name": f"{name}-config",
            "items": [
                {"key": "hostfile", "path": "hostfile", "mode": 0o444},
                {"key": "discover_hosts.sh", "path": "discover_hosts.sh", "mode": 0o555},
            ],
        },
    }
    launcher = _pod(
        job,
        "Launcher",
        0,
        pod_name=f"{name}-launcher-sim00",  # the launcher Job's generateName <name>-launcher- plus a suffix
        hostname=f"{name}-launcher",
        env_extra=launcher_env,
        volumes=[ssh_volume, config_volume],
        mounts=[ssh_mount, {"name": "mpi-job-config", "mountPath": CONFIG_MOUNT}],
        secrets=secrets or {},
    )
    launcher.files = {HOSTFILE: hosts, f"{CONFIG_MOUNT}/discover_hosts.sh": discover}
    workers = [
        _pod(
            job,
            "Worker",
            i,
            pod_name=f"{name}-worker-{i}",
            hostname=f"{name}-worker-{i}",
            env_extra=[{"name": "K_MPI_JOB_ROLE", "value": "worker"}],
            volumes=[ssh_volume],
            mounts=[ssh_mount],
            secrets=secrets or {},
            searches=[f"{name}.{namespace}.svc.{CLUSTER_DOMAIN}"],
        )
        for i in range(workers_n)
    ]
    return MPIJobPods(launcher=launcher, workers=workers, hostfile=hosts, ssh_secret=f"{name}-ssh")


def _pod(
    job: dict,
    kind: str,
    index: int,
    *,
    pod_name: str,
    hostname: str,
    env_extra: list[dict],
    volumes: list[dict],
    mounts: list[dict],
    secrets: Mapping,
    searches: tuple[str, ...] | list[str] = (),
) -> SimPod:
    name, namespace = job["metadata"]["name"], job["metadata"].get("namespace", "default")
    replica = job["spec"]["mpiReplicaSpecs"][kind]
    template = copy.deepcopy(replica["template"])
    pod_spec = template["spec"]
    main = pod_spec["containers"][0]
    if kind == "Worker" and not main.get("command") and not main.get("args"):
        main["command"] = list(SSHD)
    main["env"] = [*main.get("env", []), *env_extra]
    pod_spec["volumes"] = [*pod_spec.get("volumes", []), *copy.deepcopy(volumes)]
    main["volumeMounts"] = [*main.get("volumeMounts", []), *copy.deepcopy(mounts)]
    labels = {
        **template.get("metadata", {}).get("labels", {}),
        "training.kubeflow.org/operator-name": "mpi-operator",
        "training.kubeflow.org/job-name": name,
        "training.kubeflow.org/job-role": kind.lower(),
    }
    if kind == "Worker":
        labels["training.kubeflow.org/replica-index"] = str(index)
    pod_spec.update(hostname=hostname, subdomain=name, dnsConfig={"searches": list(searches)})
    pod = {"metadata": {"name": pod_name, "namespace": namespace, "labels": labels}, "spec": pod_spec}
    policy = replica["restartPolicy"]
    return start_pod(pod, role=kind.lower(), index=index, services=[name], secrets=secrets, restart_policy=policy)
