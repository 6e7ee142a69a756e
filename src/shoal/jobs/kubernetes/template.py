"""The pod template every Kubernetes kind runs: its command, container, resources, env, volumes,
/dev/shm, grace. Each function takes the job (:class:`~shoal.jobs.spec.JobSpec`) and its pod options
(:class:`~shoal.jobs.kubernetes.options.PodOptions`).

The pod's command is the job's own command, run directly (no launch script): ``shoal train ...``
as given, or ``shoal run SCRIPT.py ARGS`` (``-m MODULE``, ``--no-python PROGRAM``) for anything
else. Inside the pod shoal reads what the operator injected (MASTER_ADDR, RANK, WORLD_SIZE,
PET_*, or Open MPI's variables) and starts the pod's processes.
"""

from __future__ import annotations

import os
from typing import Any

from shoal.errors import ShoalError
from shoal.jobs.kubernetes.options import SHM_MOUNT, PodOptions, check_devices, grace_period, pod_env
from shoal.jobs.spec import JobSpec

GPU_RESOURCE = "nvidia.com/gpu"
SHM_VOLUME = "dshm"
RESERVED_ENV_PREFIXES = ("PET_", "OMPI_MCA_")
RESERVED_ENV = frozenset(
    {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "K_MPI_JOB_ROLE", "JOB_COMPLETION_INDEX"}
)
"""Variables the operators set on the pods (training-operator, Trainer, MPI operator, the Job
controller): a user's value would be overridden or refused, so ``--env`` may not name them."""


def check(spec: JobSpec, pods: PodOptions) -> PodOptions:
    """``pods`` if the job can run on them: an image (every pod needs one), GPUs as the command's
    ``--device`` wants, ``spec.nodes`` within ``--elastic``. Every renderer of a kind calls it first."""
    pods.require_image()
    check_devices(spec.command, spec.gpus_per_node)
    if pods.elastic is not None and not pods.elastic[0] <= spec.nodes <= pods.elastic[1]:
        low, high = pods.elastic
        raise ShoalError(
            f"--nnodes {spec.nodes} is outside --elastic {low}:{high}",
            f"give --nnodes between {low} and {high} (the pods started at first)",
        )
    return pods


def pod_command(spec: JobSpec, nproc: int | None = None) -> list[str]:
    """What the pod's container runs: ``shoal ...`` as given, else ``shoal run ...``.

    ``nproc``: pass ``--nproc-per-node N`` to ``shoal run`` (for platforms that give the pod no
    ``PET_NPROC_PER_NODE``, such as Run:ai's submit commands); a ``shoal train`` command then runs
    as ``shoal run --nproc-per-node N -m shoal train ...``.
    """
    first = spec.command[0]
    if os.path.basename(first) == "shoal" and nproc is None:
        return ["shoal", *spec.command[1:]]
    flags = ["--nproc-per-node", str(nproc)] if nproc is not None else []
    return ["shoal", "run", *flags, *spec.launcher_target()]


def env_entries(spec: JobSpec, pods: PodOptions) -> list[dict[str, Any]]:
    """The container's ``env``: ``--env`` values (already resolved) and ``--secret-env`` references."""
    values = pod_env(spec.env, {})
    for name in [n for n, _ in values] + [s.name for s in pods.secret_env]:
        if name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES):
            raise ShoalError(
                f"--env {name}: the operator sets this variable on every pod",
                "drop it; shoal reads the operator's value inside the pod",
            )
    entries: list[dict[str, Any]] = [{"name": name, "value": value} for name, value in values]
    entries += [
        {"name": s.name, "valueFrom": {"secretKeyRef": {"name": s.secret, "key": s.key}}} for s in pods.secret_env
    ]
    return entries


def resources(spec: JobSpec, pods: PodOptions, *, gpus: bool = True) -> dict[str, Any]:
    """Requests (CPU, memory) and limits (memory, GPUs) of one pod."""
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if pods.cpu:
        requests["cpu"] = pods.cpu
    if pods.memory:
        requests["memory"] = limits["memory"] = pods.memory
    if gpus and spec.gpus_per_node:
        limits[GPU_RESOURCE] = spec.gpus_per_node
    return {key: value for key, value in (("requests", requests), ("limits", limits)) if value}


def volume_name(claim: str) -> str:
    return f"pvc-{claim.replace('.', '-')}"[:63].rstrip("-")


def volumes(spec: JobSpec, pods: PodOptions, *, shm: bool = True) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod's volumes and the container's mounts: every claim, and a memory-backed /dev/shm.

    The container runtime's default /dev/shm is 64 MB, which DataLoader workers exhaust.
    """
    pod_volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for volume in pods.volumes:
        name = volume_name(volume.claim)
        if all(v["name"] != name for v in pod_volumes):
            pod_volumes.append({"name": name, "persistentVolumeClaim": {"claimName": volume.claim}})
        mount: dict[str, Any] = {"name": name, "mountPath": volume.mount_path}
        if volume.read_only:
            mount["readOnly"] = True
        mounts.append(mount)
    if shm:
        empty_dir: dict[str, Any] = {"medium": "Memory"}
        if pods.shm_size:
            empty_dir["sizeLimit"] = pods.shm_size
        pod_volumes.append({"name": SHM_VOLUME, "emptyDir": empty_dir})
        mounts.append({"name": SHM_VOLUME, "mountPath": SHM_MOUNT})
    return pod_volumes, mounts


def container(
    spec: JobSpec,
    pods: PodOptions,
    name: str,
    command: list[str],
    *,
    env: list[dict[str, Any]] | None = None,
    mounts: list[dict[str, Any]] | None = None,
    ports: list[dict[str, Any]] | None = None,
    gpus: bool = True,
) -> dict[str, Any]:
    """One container of the job's image running ``command``."""
    out: dict[str, Any] = {"name": name, "image": pods.require_image(), "command": command}
    if env:
        out["env"] = env
    if ports:
        out["ports"] = ports
    res = resources(spec, pods, gpus=gpus)
    if res:
        out["resources"] = res
    if mounts:
        out["volumeMounts"] = mounts
    return out


def pod_template(
    spec: JobSpec, pods: PodOptions, containers: list[dict[str, Any]], pod_volumes: list[dict[str, Any]]
) -> dict:
    """A pod template: the containers, their volumes, and a grace period covering ``--preempt-grace``."""
    body: dict[str, Any] = {"terminationGracePeriodSeconds": termination_grace(spec, pods), "containers": containers}
    if pod_volumes:
        body["volumes"] = pod_volumes
    return {"spec": body}


def termination_grace(spec: JobSpec, pods: PodOptions) -> int:
    return grace_period(spec.command, pods.grace_period_s)


def metadata(spec: JobSpec, pods: PodOptions) -> dict[str, str]:
    return {"name": spec.job_name, "namespace": pods.namespace}
