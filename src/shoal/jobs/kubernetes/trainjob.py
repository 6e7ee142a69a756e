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

Fault tolerance (a ``shoal train ... --fault-tolerance`` command): :func:`render_objects` renders
the lighthouse beside the TrainJob and the trainer's command names it (:mod:`.fault_tolerance`).
The pods are the ones every TrainJob gets, and their restarts follow the runtime, not the TrainJob:

- a TrainJob cannot set the pods' restartPolicy, the Job's backoffLimit, nor the JobSet's
  failurePolicy: ``runtimePatches`` reach a replicated job's pod template only, and of it only
  volumes, (init) containers' env, mounts and securityContext, scheduling fields, the service
  account and the grace period (kubeflow/trainer 8c0f505, pkg/apis/trainer/v1alpha1/trainjob_types.go
  ``JobSpecPatch``, ``PodSpecPatch``, ``ContainerPatch``);
- the torch-distributed runtime sets none of the three (manifests/base/runtimes/torch_distributed.yaml),
  nor does Trainer (pkg/runtime/framework/plugins/jobset/builder.go); JobSet's webhook makes the
  pods' restartPolicy OnFailure (kubernetes-sigs/jobset v0.12.0, Trainer's go.mod;
  pkg/webhooks/jobset_webhook.go ``Default``) and the node job Indexed: a container that fails is
  restarted in place by the kubelet, a pod that is lost is replaced for its completion index (so
  its PET_NODE_RANK) alone, and the other pods keep running and training;
- the Job counts both, against backoffLimit, 6 when unset (kubernetes/kubernetes v1.32,
  pkg/apis/batch/v1/defaults.go ``SetDefaults_Job``): it fails once the container restarts of its
  running and pending pods sum to 6, or more than 6 pods failed (pkg/controller/job/job_controller.go
  ``pastBackoffLimitOnFailure``); then JobSet, with no failurePolicy, fails the JobSet, and so the
  TrainJob (jobset pkg/controllers/failure_policy.go ``executeFailurePolicy``).

So ``--max-restarts`` is refused: the budget is the runtime's (``--runtime NAME`` names one whose
node job sets ``backoffLimit``). The pods' command and variables are a PyTorchJob's: the same
command, PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR/PORT.
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


def render_objects(spec: JobSpec, pods: PodOptions, runtime: str = DEFAULT_RUNTIME) -> list[dict[str, Any]]:
    """What ``shoal launch k8s --kind trainjob`` applies: the TrainJob for ``spec`` on ``pods``
    (``spec.nodes`` nodes of ``spec.local_world_size`` processes each), after the lighthouse's
    Deployment and Service when the command is fault-tolerant and names no lighthouse of its own."""
    template.check(spec, pods)
    command, lighthouse = fault_tolerance.prepare(spec, pods, template.pod_command(spec))
    # JobSet names the node job <name>-node-0; the Job controller names its pods' hosts <job>-<index>.
    check_job_name(spec.job_name, [f"{spec.job_name}-{NODE}-0-{spec.nodes - 1}"])
    if spec.master_port not in (None, DEFAULT_MAIN_PORT):
        raise ShoalError(
            f"--master-port {spec.master_port}: Trainer always uses port {DEFAULT_MAIN_PORT} for the torch rendezvous",
            "drop --master-port",
        )
    if spec.max_restarts:
        # Said alike with or without fault tolerance: a JobSet failurePolicy would act only once the
        # Job's backoffLimit is spent, and then restart every pod (module docstring).
        raise ShoalError(
            f"--max-restarts {spec.max_restarts}: a TrainJob cannot set how often its pods restart; the runtime's "
            "Job counts them against its backoffLimit (6 in torch-distributed)",
            "drop --max-restarts, name a runtime whose node job sets backoffLimit (--runtime NAME), "
            "or use --kind pytorchjob",
        )
    if pods.elastic is not None:
        raise ShoalError("--elastic: Trainer v2 has no elastic torch jobs yet", "use --kind pytorchjob for --elastic")
    trainer: dict[str, Any] = {
        "image": pods.require_image(),
        "command": command,
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
    job = {"apiVersion": API_VERSION, "kind": "TrainJob", "metadata": template.metadata(spec, pods), "spec": body}
    return [*lighthouse, job]


def render_trainjob(spec: JobSpec, pods: PodOptions, runtime: str = DEFAULT_RUNTIME) -> dict[str, Any]:
    """The TrainJob alone, for a job that needs nothing beside it (ShoalError for a fault-tolerant
    command whose lighthouse shoal renders: :func:`render_objects` renders both)."""
    return fault_tolerance.job_alone(render_objects(spec, pods, runtime), "render_trainjob")
