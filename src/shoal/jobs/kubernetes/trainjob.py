"""Kubeflow Trainer v2's ``TrainJob`` (trainer.kubeflow.org/v1alpha1) on the torch-distributed runtime.

The TrainJob names a ClusterTrainingRuntime (``torch-distributed``, kubeflow/trainer
manifests/base/runtimes/torch_distributed.yaml) and fills in what the runtime leaves open: image,
command, env, numNodes, numProcPerNode and resourcesPerNode. Trainer's torch plugin
(pkg/runtime/framework/plugins/torch/torch.go) gives each node's container PET_NNODES,
PET_NPROC_PER_NODE, PET_NODE_RANK (the Job completion index) and PET_MASTER_ADDR/PORT
(``<name>-node-0-0.<name>``, port 29500), and nothing else: no MASTER_ADDR, RANK or WORLD_SIZE.

What the TrainJob's ``trainer`` cannot say (volumes, /dev/shm, the grace period) goes into a
``runtimePatches`` entry for the runtime's ``node`` job and container.

``auto`` processes per node is resolved here, as shoal means it (one per GPU, or one on CPU):
Trainer's own ``auto`` starts one process per requested CPU on CPU pods.
"""

from __future__ import annotations

from typing import Any

from shoal.env.base import DEFAULT_MAIN_PORT
from shoal.errors import ShoalError
from shoal.jobs.kubernetes import fault_tolerance, template
from shoal.jobs.kubernetes.options import PodOptions, check_job_name
from shoal.jobs.spec import JobSpec

API_VERSION = "trainer.kubeflow.org/v1alpha1"
DEFAULT_RUNTIME = "torch-distributed"
NODE = "node"
"""The runtime's replicated job and container that run the trainer (Trainer's constants.Node)."""
PATCH_MANAGER = "shoal/launch"
"""Owner of the runtime patch (a domain-prefixed path, as Trainer's webhook requires)."""


def render_trainjob(spec: JobSpec, pods: PodOptions, runtime: str = DEFAULT_RUNTIME) -> dict[str, Any]:
    """The TrainJob for ``spec`` on ``pods``: ``spec.nodes`` nodes of ``spec.local_world_size`` processes each."""
    template.check(spec, pods)
    fault_tolerance.refuse_kind(spec, "a TrainJob")
    # JobSet names the node job <name>-node-0; the Job controller names its pods' hosts <job>-<index>.
    check_job_name(spec.job_name, [f"{spec.job_name}-{NODE}-0-{spec.nodes - 1}"])
    if spec.master_port not in (None, DEFAULT_MAIN_PORT):
        raise ShoalError(
            f"--master-port {spec.master_port}: Trainer always uses port {DEFAULT_MAIN_PORT} for the torch rendezvous",
            "drop --master-port",
        )
    if spec.max_restarts:
        raise ShoalError(
            "--max-restarts: a TrainJob's restarts are set by its runtime's JobSet failurePolicy, not by the TrainJob",
            "drop --max-restarts, or set failurePolicy.maxRestarts in the ClusterTrainingRuntime",
        )
    if pods.elastic is not None:
        raise ShoalError("--elastic: Trainer v2 has no elastic torch jobs yet", "use --kind pytorchjob for --elastic")
    trainer: dict[str, Any] = {
        "image": pods.require_image(),
        "command": template.pod_command(spec),
        "numNodes": spec.nodes,
        "numProcPerNode": spec.local_world_size,
    }
    env = template.env_entries(spec, pods)
    if env:
        trainer["env"] = env
    resources = template.resources(spec, pods)
    if resources:
        trainer["resourcesPerNode"] = resources
    volumes, mounts = template.volumes(spec, pods)
    pod_spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": template.termination_grace(spec, pods),
        "containers": [{"name": NODE, "volumeMounts": mounts}],
        "volumes": volumes,
    }
    patch = {
        "manager": PATCH_MANAGER,
        "trainingRuntimeSpec": {
            "template": {
                "spec": {"replicatedJobs": [{"name": NODE, "template": {"spec": {"template": {"spec": pod_spec}}}}]}
            }
        },
    }
    body = {
        "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime", "name": runtime},
        "trainer": trainer,
        "runtimePatches": [patch],
    }
    return {"apiVersion": API_VERSION, "kind": "TrainJob", "metadata": template.metadata(spec, pods), "spec": body}
