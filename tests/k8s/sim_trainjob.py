"""The pods Kubeflow Trainer v2 creates for a TrainJob on a ClusterTrainingRuntime, through a JobSet.

Rules, from kubeflow/trainer at commit 8c0f505 (the CRDs' commit) and the JobSet it runs
(kubernetes-sigs/jobset v0.12.0, Trainer's go.mod):

- admission: pkg/runtime/core/trainingruntime.go (the runtime must exist), the torch plugin's
  ``Validate`` (pkg/runtime/framework/plugins/torch/torch.go: no PET_NNODES, PET_NPROC_PER_NODE,
  PET_NODE_RANK, PET_MASTER_ADDR/PORT in ``trainer.env``) and the jobset plugin's
  (pkg/runtime/framework/plugins/jobset/jobset.go: a runtime patch's ``manager`` is a
  domain-prefixed path, it names replicated jobs and containers the runtime has, and sets no env on
  the ``node`` container);
- the JobSet: the runtime's template with each ``runtimePatches`` entry applied as a strategic merge
  patch (trainingruntime.go ``mergeRuntimePatches``; lists merge by ``name``, volume mounts by
  ``mountPath``, as k8s.io/api's patchMergeKey tags say), then builder.go ``Trainer``: the ancestor
  ``trainer`` job's ``node`` container takes the TrainJob's image, command and args and has its env
  upserted; ``resourcesPerNode`` replaces the node container's requests and limits key by key;
- torch.go ``EnforceMLPolicy``: the pod count is ``numNodes``; processes per node are
  ``numProcPerNode``, else ``auto``, which without GPUs becomes the CPU request (else limit), rounded
  up, at least 1; then PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK (the Job completion index),
  PET_MASTER_ADDR (``<name>-node-0-0.<name>``) and PET_MASTER_PORT (29500, constants.go
  ``ContainerTrainerPort``) are upserted, and container port 29500 added;
- JobSet (pkg/controllers/jobset_controller.go, placement.go; webhook default
  ``enableDNSHostnames: true``): Job ``<name>-<replicatedJob>-<jobIndex>``, pods' subdomain the
  JobSet's name, a headless Service of that name;
- Kubernetes' Job controller (kubernetes pkg/controller/job/job_controller.go, indexed_job_utils.go):
  an Indexed Job's pod ``i`` has hostname ``<job>-<i>``, generateName ``<job>-<i>-``, the
  ``batch.kubernetes.io/job-completion-index`` annotation and label, and JOB_COMPLETION_INDEX;
- failures (:func:`jobset`, :func:`job_fails`, :func:`after_job_failure`): the pods' restartPolicy
  and the Job's backoffLimit as JobSet's webhook and the Job API default them, when the Job
  controller fails the Job, and what JobSet then does (each function cites its source).
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from k8s.sim_cluster import SimPod, SimulationError, start_pod

NODE = "node"
TRAINER_PORT = 29500
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
MERGE_KEYS = {"replicatedJobs": "name", "containers": "name", "initContainers": "name", "volumes": "name",
              "env": "name", "volumeMounts": "mountPath", "ports": "containerPort"}  # fmt: skip
_DOMAIN_PREFIXED = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/\S+")


def strategic_merge(base: Any, patch: Any, key: str | None = None) -> Any:
    """``patch`` merged into ``base``: maps recursively, keyed lists item by item, anything else replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for field, value in patch.items():
            out[field] = strategic_merge(out.get(field), value, field) if field in out else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list) and key in MERGE_KEYS:
        merge_key = MERGE_KEYS[key]
        out = copy.deepcopy(base)
        for item in patch:
            match = next((i for i, old in enumerate(out) if old.get(merge_key) == item.get(merge_key)), None)
            if match is None:
                out.append(copy.deepcopy(item))
            else:
                out[match] = strategic_merge(out[match], item)
        return out
    return copy.deepcopy(patch)


def _upsert_env(env: list[dict], entries: list[dict]) -> None:
    for entry in entries:
        at = next((i for i, old in enumerate(env) if old["name"] == entry["name"]), None)
        if at is None:
            env.append(copy.deepcopy(entry))
        else:
            env[at] = copy.deepcopy(entry)


def _quantity_ceil(value: Any) -> int:
    """resource.Quantity.Value(): the quantity rounded up to a whole number."""
    text = str(value)
    if text.endswith("m"):
        return math.ceil(int(text[:-1]) / 1000)
    return math.ceil(float(text))


def admit(trainjob: Mapping[str, Any], runtime: Mapping[str, Any]) -> None:
    """Raise :class:`SimulationError` where Trainer's webhook would refuse ``trainjob``."""
    spec = trainjob["spec"]
    ref = spec["runtimeRef"]
    if ref.get("kind", "ClusterTrainingRuntime") != runtime["kind"] or ref["name"] != runtime["metadata"]["name"]:
        raise SimulationError(f"spec.runtimeRef: {ref} must be created before the TrainJob is created")
    if ref.get("apiGroup", "trainer.kubeflow.org") != runtime["apiVersion"].split("/")[0]:
        raise SimulationError(f"spec.runtimeRef.apiGroup {ref.get('apiGroup')!r} is not the runtime's")
    reserved = sorted({e["name"] for e in spec.get("trainer", {}).get("env", [])} & set(RESERVED_ENV))
    if reserved and "torch" in runtime["spec"].get("mlPolicy", {}):
        raise SimulationError(f"spec.trainer.env: must not have reserved envs, invalid envs configured: {reserved}")
    jobs = {j["name"]: j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]}
    for patch in spec.get("runtimePatches", []):
        if not _DOMAIN_PREFIXED.fullmatch(patch["manager"]):
            raise SimulationError(f"spec.runtimePatches.manager {patch['manager']!r}: must be a domain-prefixed path")
        patched = patch.get("trainingRuntimeSpec", {}).get("template", {}).get("spec", {}).get("replicatedJobs", [])
        for job_patch in patched:
            if job_patch["name"] not in jobs:
                raise SimulationError(
                    "spec.runtimePatches: must not have replicated job that doesn't exist in the runtime"
                )
            names = {c["name"] for c in jobs[job_patch["name"]]["template"]["spec"]["template"]["spec"]["containers"]}
            pod_patch = job_patch.get("template", {}).get("spec", {}).get("template", {}).get("spec", {})
            for container in pod_patch.get("containers", []):
                if container["name"] not in names:
                    raise SimulationError(f"spec.runtimePatches: container {container['name']!r} is not in the runtime")
                if container.get("env") and container["name"] == NODE:
                    raise SimulationError("spec.runtimePatches: must not have envs for the node container")


def jobset(trainjob: Mapping[str, Any], runtime: Mapping[str, Any]) -> dict[str, Any]:
    """The JobSet spec Trainer makes of ``trainjob`` on ``runtime`` (a ClusterTrainingRuntime), as the
    API server stores it: Trainer's build (the runtime patches merged, the trainer's fields and PET_*
    variables on the ``node`` container, ``replicas`` 1 and ``numNodes`` pods: builder.go, torch.go,
    jobset.go ``SyncParallelCount``), then JobSet's webhook defaults (jobset v0.12.0,
    pkg/webhooks/jobset_webhook.go ``Default``: completionMode Indexed, pod restartPolicy OnFailure
    when unset) and the Job API's (kubernetes v1.32, pkg/apis/batch/v1/defaults.go
    ``SetDefaults_Job``: backoffLimit 6 when unset)."""
    admit(trainjob, runtime)
    name = trainjob["metadata"]["name"]
    trainer = trainjob["spec"].get("trainer", {})
    spec = copy.deepcopy(runtime["spec"]["template"]["spec"])
    for patch in trainjob["spec"].get("runtimePatches", []):
        patch_spec = patch.get("trainingRuntimeSpec", {}).get("template", {}).get("spec")
        if patch_spec:
            spec = strategic_merge(spec, patch_spec)
    ml_policy = runtime["spec"].get("mlPolicy", {})
    for job in spec["replicatedJobs"]:
        job_spec = job["template"]["spec"]
        job_spec.setdefault("completionMode", "Indexed")
        job_spec.setdefault("backoffLimit", 6)
        job_spec["template"]["spec"].setdefault("restartPolicy", "OnFailure")
        if job["template"].get("metadata", {}).get("labels", {}).get(ANCESTOR_LABEL) != "trainer":
            continue  # initializers: not simulated (shoal's TrainJobs use none)
        job["replicas"] = 1
        main = next(c for c in job_spec["template"]["spec"]["containers"] if c["name"] == NODE)
        for field in ("image", "command", "args"):
            if trainer.get(field) is not None:
                main[field] = copy.deepcopy(trainer[field])
        main.setdefault("env", [])
        _upsert_env(main["env"], trainer.get("env", []))
        if trainer.get("resourcesPerNode"):
            for part in ("requests", "limits"):
                merged = {**main.get("resources", {}).get(part, {}), **trainer["resourcesPerNode"].get(part, {})}
                if merged:
                    main.setdefault("resources", {})[part] = merged
        count = trainer.get("numNodes", ml_policy.get("numNodes", 1))
        job_spec["parallelism"] = job_spec["completions"] = count
        nproc = _nproc_per_node(trainer, main.get("resources", {}))
        _upsert_env(
            main["env"],
            [
                {"name": "PET_NNODES", "value": str(count)},
                {"name": "PET_NPROC_PER_NODE", "value": str(nproc)},
                {
                    "name": "PET_NODE_RANK",
                    "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}},
                },
                {"name": "PET_MASTER_ADDR", "value": f"{name}-{NODE}-0-0.{name}"},
                {"name": "PET_MASTER_PORT", "value": str(TRAINER_PORT)},
            ],
        )
        ports = main.setdefault("ports", [])
        if all(p.get("containerPort") != TRAINER_PORT for p in ports):
            ports.append({"containerPort": TRAINER_PORT})
    return spec


def simulate(
    trainjob: Mapping[str, Any],
    runtime: Mapping[str, Any],
    *,
    secrets: Mapping[str, Mapping[str, str]] | None = None,
) -> list[SimPod]:
    """The pods of ``trainjob`` on ``runtime`` (a ClusterTrainingRuntime), by completion index."""
    name, namespace = trainjob["metadata"]["name"], trainjob["metadata"].get("namespace", "default")
    pods: list[SimPod] = []
    for job in jobset(trainjob, runtime)["replicatedJobs"]:
        if job["template"].get("metadata", {}).get("labels", {}).get(ANCESTOR_LABEL) != "trainer":
            continue
        job_name = f"{name}-{job['name']}-0"  # <jobset>-<replicatedJob>-<job index>: one job (replicas 1)
        for index in range(job["template"]["spec"]["completions"]):
            pods.append(_pod(name, namespace, job_name, index, job["template"]["spec"]["template"], secrets or {}))
    if not pods:
        raise SimulationError("the runtime has no replicated job with the trainer ancestor label")
    return pods


def job_fails(job: Mapping[str, Any], restarts: Sequence[int] = (), failed_pods: int = 0) -> bool:
    """Whether Kubernetes' Job controller fails ``job`` (a replicated job of :func:`jobset`), given
    the container restarts of its running and pending pods and how many of its pods failed
    (kubernetes v1.32, pkg/controller/job/job_controller.go: more failed pods than backoffLimit;
    or, under restartPolicy OnFailure, ``pastBackoffLimitOnFailure``: the restarts sum to
    backoffLimit, any restart when it is 0)."""
    spec = job["template"]["spec"]
    limit = spec["backoffLimit"]
    if failed_pods > limit:
        return True
    if spec["template"]["spec"]["restartPolicy"] != "OnFailure":
        return False
    return sum(restarts) > 0 if limit == 0 else sum(restarts) >= limit


def after_job_failure(spec: Mapping[str, Any], restarts_so_far: int = 0) -> str:
    """What JobSet does once a Job of ``spec`` (:func:`jobset`) failed (jobset v0.12.0,
    pkg/controllers/failure_policy.go ``executeFailurePolicy``): no failurePolicy, "Failed"; one
    whose rules match nothing, its default action, "RestartJobSet" (every Job recreated: every pod)
    until ``maxRestarts``, then "Failed". Rules are not simulated (shoal renders none)."""
    policy = spec.get("failurePolicy")
    if policy is None:
        return "Failed"
    if policy.get("rules"):
        raise SimulationError("failurePolicy rules are not simulated")
    return "RestartJobSet" if restarts_so_far < policy.get("maxRestarts", 0) else "Failed"


def _nproc_per_node(trainer: Mapping[str, Any], resources: Mapping[str, Any]) -> int | str:
    if trainer.get("numProcPerNode") is not None:
        return trainer["numProcPerNode"]
    gpus = 0
    for part in ("requests", "limits"):
        for resource, quantity in resources.get(part, {}).items():
            if "gpu" in resource.lower() and gpus == 0:
                gpus = _quantity_ceil(quantity)
    if gpus:
        return "auto"
    cpu = resources.get("requests", {}).get("cpu") or resources.get("limits", {}).get("cpu")
    return max(1, _quantity_ceil(cpu) if cpu is not None else 0)


def _pod(jobset: str, namespace: str, job: str, index: int, template: dict, secrets: Mapping) -> SimPod:
    labels = {**template.get("metadata", {}).get("labels", {}), COMPLETION_INDEX: str(index)}
    annotations = {**template.get("metadata", {}).get("annotations", {}), COMPLETION_INDEX: str(index)}
    pod_spec = copy.deepcopy(template["spec"])
    for container in pod_spec["containers"]:
        env = container.setdefault("env", [])
        if all(e["name"] != "JOB_COMPLETION_INDEX" for e in env):
            env.append(
                {
                    "name": "JOB_COMPLETION_INDEX",
                    "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{COMPLETION_INDEX}']"}},
                }
            )
    pod_name = f"{job}-{index}-sim{index:02d}"  # generateName <job>-<index>- plus the API server's suffix
    pod = {
        "metadata": {"name": pod_name, "namespace": namespace, "labels": labels, "annotations": annotations},
        "spec": {**pod_spec, "hostname": f"{job}-{index}", "subdomain": jobset},
    }
    return start_pod(pod, role=NODE, index=index, services=[jobset], secrets=secrets, main=NODE)
