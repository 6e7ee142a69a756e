"""Kubeflow training-operator's ``PyTorchJob`` (kubeflow.org/v1).

One pod per node: a Master (pod index 0, rank 0's pod) and ``nodes - 1`` Workers, each running the
job's command; ``nprocPerNode`` processes per pod. The operator (kubeflow/training-operator,
pkg/controller.v1/pytorch/envvar.go, v1.9.0) gives every pod MASTER_ADDR (the master's Service,
``<name>-master-0``), MASTER_PORT (the container port named ``pytorchjob-port``), RANK (the pod
index, master first), WORLD_SIZE (pods x nprocPerNode since 1.7), and PET_NNODES, PET_NODE_RANK,
PET_NPROC_PER_NODE, PET_MASTER_ADDR/PORT, which shoal reads inside the pod.

Elastic (``--elastic MIN:MAX``): Workers only, an ``elasticPolicy`` (c10d rendezvous on worker 0's
Service, PET_NNODES=MIN:MAX, PET_MAX_RESTARTS), as the operator's elastic examples are built.

Fault tolerance (a ``shoal train ... --fault-tolerance`` command): :func:`render_objects` renders
the lighthouse beside the job and the pods' command names it (:mod:`.fault_tolerance`); a pod whose
container dies is restarted alone (restartPolicy OnFailure), and ``runPolicy.backoffLimit``
(``--max-restarts``, at least 1) bounds those restarts across the job's pods.
"""

from __future__ import annotations

import copy
from typing import Any

from shoal.errors import ShoalError
from shoal.jobs.kubernetes import fault_tolerance, template
from shoal.jobs.kubernetes.options import PodOptions, check_job_name
from shoal.jobs.spec import JobSpec

API_VERSION = "kubeflow.org/v1"
CONTAINER = "pytorch"
"""The operator finds its port on the container of this name (PyTorchJobDefaultContainerName)."""
PORT_NAME = "pytorchjob-port"


def render_objects(spec: JobSpec, pods: PodOptions) -> list[dict[str, Any]]:
    """What ``shoal launch k8s`` applies: the PyTorchJob for ``spec`` on ``pods`` (``spec.nodes``
    pods of ``spec.nproc`` processes), after the lighthouse's Deployment and Service when the
    command is fault-tolerant and names no lighthouse of its own (:func:`.fault_tolerance.prepare`)."""
    template.check(spec, pods)
    command, lighthouse = fault_tolerance.prepare(spec, pods, template.pod_command(spec))
    if fault_tolerance.fault_tolerant(spec.command) and spec.max_restarts < 1:
        raise ShoalError(
            "--fault-tolerance with --max-restarts 0: the first pod that restarts would fail the whole PyTorchJob",
            f"give --max-restarts {fault_tolerance.MIN_RESTARTS} or more (a lost group comes back as its pod's "
            "container restarting)",
        )
    elastic = pods.elastic
    last_worker = spec.nodes - 1 if elastic else spec.nodes - 2
    check_job_name(spec.job_name, [f"{spec.job_name}-master-0", f"{spec.job_name}-worker-{max(0, last_worker)}"])
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
    job = {"apiVersion": API_VERSION, "kind": "PyTorchJob", "metadata": template.metadata(spec, pods), "spec": body}
    return [*lighthouse, job]


def render_pytorchjob(spec: JobSpec, pods: PodOptions) -> dict[str, Any]:
    """The PyTorchJob alone, for a job that needs nothing beside it (ShoalError for a fault-tolerant
    command whose lighthouse shoal renders: :func:`render_objects` renders both)."""
    return fault_tolerance.job_alone(render_objects(spec, pods), "render_pytorchjob")
