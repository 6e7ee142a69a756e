"""Kubeflow training-operator's ``PyTorchJob`` (kubeflow.org/v1).

One pod per node: a Master (pod index 0, rank 0's pod) and ``nodes - 1`` Workers, each running the
job's command; ``nprocPerNode`` processes per pod. The operator (kubeflow/training-operator,
pkg/controller.v1/pytorch/envvar.go, v1.9.0) gives every pod MASTER_ADDR (the master's Service,
``<name>-master-0``), MASTER_PORT (the container port named ``pytorchjob-port``), RANK (the pod
index, master first), WORLD_SIZE (pods x nprocPerNode since 1.7), and PET_NNODES, PET_NODE_RANK,
PET_NPROC_PER_NODE, PET_MASTER_ADDR/PORT, which shoal reads inside the pod.

Elastic (``--elastic MIN:MAX``): Workers only, an ``elasticPolicy`` (c10d rendezvous on worker 0's
Service, PET_NNODES=MIN:MAX, PET_MAX_RESTARTS), as the operator's elastic examples are built.

Fault tolerance (a ``shoal train ... --fault-tolerance`` command): the pods' command names the
lighthouse that :func:`render_objects` renders beside the job (:mod:`.fault_tolerance`).
"""

from __future__ import annotations

import copy
from typing import Any

from shoal.jobs.kubernetes import fault_tolerance, template
from shoal.jobs.kubernetes.options import PodOptions, check_job_name
from shoal.jobs.spec import JobSpec

API_VERSION = "kubeflow.org/v1"
CONTAINER = "pytorch"
"""The operator finds its port on the container of this name (PyTorchJobDefaultContainerName)."""
PORT_NAME = "pytorchjob-port"


def render_pytorchjob(spec: JobSpec, pods: PodOptions) -> dict[str, Any]:
    """The PyTorchJob for ``spec`` on ``pods`` (``spec.nodes`` pods of ``spec.nproc`` processes)."""
    template.check(spec, pods)
    elastic = pods.elastic
    last_worker = spec.nodes - 1 if elastic else spec.nodes - 2
    names = [f"{spec.job_name}-master-0", f"{spec.job_name}-worker-{max(0, last_worker)}"]
    command = template.pod_command(spec)
    if fault_tolerance.fault_tolerant(spec.command):
        fault_tolerance.check(spec, pods)
        names.append(fault_tolerance.lighthouse_name(spec))
        command = fault_tolerance.pod_command(spec, command)
    check_job_name(spec.job_name, names)
    volumes, mounts = template.volumes(spec, pods)
    container = template.container(
        spec,
        pods,
        CONTAINER,
        command,
        env=template.env_entries(spec, pods),
        mounts=mounts,
        ports=[{"name": PORT_NAME, "containerPort": spec.port()}],
    )
    pod_template = template.pod_template(spec, pods, [container], volumes)
    replicas: dict[str, Any] = {}
    if elastic is None:
        replicas["Master"] = {"replicas": 1, "restartPolicy": "OnFailure", "template": copy.deepcopy(pod_template)}
    workers = spec.nodes if elastic else spec.nodes - 1
    if workers:
        replicas["Worker"] = {"replicas": workers, "restartPolicy": "OnFailure", "template": pod_template}
    body: dict[str, Any] = {"nprocPerNode": str(spec.nproc)}
    if elastic is not None:
        body["elasticPolicy"] = {
            "minReplicas": elastic[0],
            "maxReplicas": elastic[1],
            "rdzvBackend": "c10d",
            "rdzvId": spec.job_name,
            "maxRestarts": spec.max_restarts,
        }
    # backoffLimit counts container restarts (OnFailure) across the job's pods: 0 fails the job at
    # the first failure (training-operator pkg/core/job.go PastBackoffLimit).
    body["runPolicy"] = {"cleanPodPolicy": "None", "backoffLimit": spec.max_restarts}
    body["pytorchReplicaSpecs"] = replicas
    return {"apiVersion": API_VERSION, "kind": "PyTorchJob", "metadata": template.metadata(spec, pods), "spec": body}


def render_objects(spec: JobSpec, pods: PodOptions) -> list[dict[str, Any]]:
    """What ``shoal launch k8s`` applies: the PyTorchJob, after the lighthouse's Deployment and
    Service when the job is fault-tolerant and names no lighthouse of its own (applied first, so
    that its name resolves when the job's pods start)."""
    job = render_pytorchjob(spec, pods)
    if fault_tolerance.fault_tolerant(spec.command) and not fault_tolerance.own_lighthouse(spec.command):
        return [*fault_tolerance.render_lighthouse(spec, pods), job]
    return [job]
