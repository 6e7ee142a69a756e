"""The pods Kubeflow's training operator creates for a PyTorchJob (kubeflow.org/v1).

Rules, from kubeflow/training-operator at tag v1.9.0 unless a version says otherwise:

- admission: defaults from pkg/apis/kubeflow.org/v1/pytorch_defaults.go (replicas 1, restartPolicy
  OnFailure, container port ``pytorchjob-port`` 23456 on the ``pytorch`` container, elastic
  min/max from each other or the worker replicas, ``nprocPerNode: auto`` since 1.7), then
  pkg/webhooks/pytorch/pytorchjob_webhook.go (name a DNS-1035 label, a container named ``pytorch``
  with an image in every replica, exactly one Master, a Worker when elastic);
- pods: pkg/controller.v1/common/pod.go ``createNewPod``: one pod per replica index named
  ``<job>-<type>-<index>`` (common/util.go ``GenGeneralName``), no hostname set (so the pod's name),
  and one headless Service of the same name per pod (common/service.go);
- environment: pkg/controller.v1/pytorch/envvar.go ``setPodEnv`` appended to each container's own:
  PYTHONUNBUFFERED; with a Master, master.go's MASTER_PORT, PET_MASTER_PORT, MASTER_ADDR
  (``<job>-master-0``), PET_MASTER_ADDR, then WORLD_SIZE, RANK (pod index, Workers after the
  Master), PET_NODE_RANK; PET_NPROC_PER_NODE; elastic.go's PET_RDZV_ENDPOINT (worker 0's Service
  and port), PET_RDZV_BACKEND, PET_NNODES (``min:max``), PET_MAX_RESTARTS, PET_RDZV_ID, else
  PET_NNODES = the pod count. Versions differ (``version``, default (1, 9)):

  - 1.6: WORLD_SIZE = pods; no PET_* besides the elastic ones; PYTHONUNBUFFERED=0;
  - 1.7: WORLD_SIZE = pods x nprocPerNode (``auto`` counts as 1: ``getNprocPerNodeInt``);
    PET_MASTER_ADDR/PORT, PET_NODE_RANK and PET_NNODES; PET_NPROC_PER_NODE only with a Master;
  - 1.8 and later: as 1.7, with PET_NPROC_PER_NODE whenever nprocPerNode is set (it defaults to
    ``auto``);
- workers wait for the master's name: initcontainer.go adds ``init-pytorch`` (alpine:3.10,
  ``nslookup <job>-master-0`` up to 100 times) to Worker pods when there is a Master.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from k8s.sim_cluster import SimPod, SimulationError, is_dns1035_label, start_pod

DEFAULT_PORT = 23456
PORT_NAME = "pytorchjob-port"
CONTAINER = "pytorch"
INIT_IMAGE = "alpine:3.10"
INIT_MAX_TRIES = 100


def admit(job: Mapping[str, Any], version: tuple[int, int] = (1, 9)) -> dict[str, Any]:
    """``job`` after the API server's defaulting and the operator's validating webhook."""
    job = copy.deepcopy(dict(job))
    name = job["metadata"]["name"]
    spec = job["spec"]
    spec.setdefault("runPolicy", {}).setdefault("cleanPodPolicy", "None")
    replicas = {key.capitalize(): value for key, value in spec.get("pytorchReplicaSpecs", {}).items()}
    spec["pytorchReplicaSpecs"] = replicas
    for replica in replicas.values():
        replica.setdefault("replicas", 1)
        replica.setdefault("restartPolicy", "OnFailure")
        containers = replica["template"]["spec"]["containers"]
        main = next((c for c in containers if c["name"] == CONTAINER), None)
        if main is not None and not any(p.get("name") == PORT_NAME for p in main.get("ports", [])):
            main.setdefault("ports", []).append({"name": PORT_NAME, "containerPort": DEFAULT_PORT})
    elastic = spec.get("elasticPolicy")
    if elastic is not None:
        if "minReplicas" in elastic and "maxReplicas" not in elastic:
            elastic["maxReplicas"] = elastic["minReplicas"]
        elif "maxReplicas" in elastic and "minReplicas" not in elastic:
            elastic["minReplicas"] = elastic["maxReplicas"]
        elif "minReplicas" not in elastic and "Worker" in replicas:
            elastic["minReplicas"] = elastic["maxReplicas"] = replicas["Worker"]["replicas"]
    if version >= (1, 7) and spec.get("nprocPerNode") is None and (elastic is None or "nProcPerNode" not in elastic):
        spec["nprocPerNode"] = "auto"
    # validating webhook
    if not is_dns1035_label(name):
        raise SimulationError(f"metadata.name {name!r}: should match a DNS-1035 label")
    if elastic is not None and "Worker" not in replicas:
        raise SimulationError("spec.pytorchReplicaSpecs[Worker]: must be configured if elastic policy is used")
    for kind, replica in replicas.items():
        if kind not in ("Master", "Worker"):
            raise SimulationError(f"spec.pytorchReplicaSpecs[{kind}]: not a supported replica type")
        containers = replica["template"]["spec"].get("containers", [])
        if not any(c.get("name") == CONTAINER for c in containers):
            raise SimulationError(f"{kind}: must have at least one container with name {CONTAINER}")
        if any(not c.get("image") for c in containers):
            raise SimulationError(f"{kind}: every container needs an image")
        if kind == "Master" and replica["replicas"] != 1:
            raise SimulationError("spec.pytorchReplicaSpecs[Master].replicas: must be 1")
        if kind == "Worker" and replica["replicas"] < 1:
            raise SimulationError("spec.pytorchReplicaSpecs[Worker].replicas: must be at least 1")
    return job


def simulate(
    job: Mapping[str, Any],
    *,
    version: tuple[int, int] = (1, 9),
    secrets: Mapping[str, Mapping[str, str]] | None = None,
) -> list[SimPod]:
    """Every pod of ``job``, Master first, then the Workers by index."""
    job = admit(job, version)
    name, namespace = job["metadata"]["name"], job["metadata"].get("namespace", "default")
    spec = job["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    pods = []
    for kind in ("Master", "Worker"):
        if kind not in replicas:
            continue
        for index in range(replicas[kind]["replicas"]):
            pods.append(_pod(job, kind, index, version, secrets or {}))
    assert {p.namespace for p in pods} == {namespace} and all(p.name.startswith(name) for p in pods)
    return pods


def _pod(job: dict, kind: str, index: int, version: tuple[int, int], secrets: Mapping) -> SimPod:
    name, namespace = job["metadata"]["name"], job["metadata"].get("namespace", "default")
    spec = job["spec"]
    replica = spec["pytorchReplicaSpecs"][kind]
    pod_name = f"{name}-{kind.lower()}-{index}"
    template = copy.deepcopy(replica["template"])
    labels = {
        **template.get("metadata", {}).get("labels", {}),
        "training.kubeflow.org/job-name": name,
        "training.kubeflow.org/operator-name": "pytorchjob-controller",
        "training.kubeflow.org/replica-type": kind.lower(),
        "training.kubeflow.org/replica-index": str(index),
    }
    if kind == "Master":
        labels["training.kubeflow.org/job-role"] = "master"
    pod_spec = template["spec"]
    for container in pod_spec["containers"]:
        container["env"] = [*container.get("env", []), *_operator_env(job, kind, index, version)]
    init = []
    if "Master" in spec["pytorchReplicaSpecs"] and kind == "Worker":
        master = f"{name}-master-0"
        init.append(
            {
                "name": "init-pytorch",
                "image": INIT_IMAGE,
                "command": [
                    "sh",
                    "-c",
                    f"err=1;for i in $(seq {INIT_MAX_TRIES}); do if nslookup {master}; then err=0 && break; fi;"
                    "echo waiting for master; sleep 2; done; exit $err",
                ],
            }
        )
    pod_spec["initContainers"] = [*pod_spec.get("initContainers", []), *init]
    pod = {"metadata": {"name": pod_name, "namespace": namespace, "labels": labels}, "spec": pod_spec}
    policy = replica["restartPolicy"]
    return start_pod(
        pod, role=kind.lower(), index=index, services=[pod_name], secrets=secrets, restart_policy=policy, main=CONTAINER
    )


def _port(job: dict, kind: str) -> int:
    containers = job["spec"]["pytorchReplicaSpecs"][kind]["template"]["spec"]["containers"]
    for container in containers:
        if container["name"] == CONTAINER:
            for port in container.get("ports", []):
                if port.get("name") == PORT_NAME:
                    return port["containerPort"]
    raise SimulationError(f"{kind}: port {PORT_NAME} not found")


def _nproc_int(spec: dict) -> int:
    value = spec.get("nprocPerNode")
    return int(value) if value is not None and str(value).isdigit() else 1


def _operator_env(job: dict, kind: str, index: int, version: tuple[int, int]) -> list[dict[str, str]]:
    name = job["metadata"]["name"]
    spec = job["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    pods = sum(r["replicas"] for r in replicas.values())
    env = [{"name": "PYTHONUNBUFFERED", "value": "1" if version >= (1, 7) else "0"}]
    if "Master" in replicas:
        port, master = str(_port(job, "Master")), f"{name}-master-0"
        if version >= (1, 7):
            env += [
                {"name": "MASTER_PORT", "value": port},
                {"name": "PET_MASTER_PORT", "value": port},
                {"name": "MASTER_ADDR", "value": master},
                {"name": "PET_MASTER_ADDR", "value": master},
            ]
        else:
            env += [{"name": "MASTER_PORT", "value": port}, {"name": "MASTER_ADDR", "value": master}]
        rank = index + 1 if kind == "Worker" else index
        world = pods * _nproc_int(spec) if version >= (1, 7) else pods
        env += [{"name": "WORLD_SIZE", "value": str(world)}, {"name": "RANK", "value": str(rank)}]
        if version[:2] == (1, 7):
            env.append({"name": "PET_NPROC_PER_NODE", "value": spec["nprocPerNode"]})
        if version >= (1, 7):
            env.append({"name": "PET_NODE_RANK", "value": str(rank)})
    if version >= (1, 8) and spec.get("nprocPerNode") is not None:
        env.append({"name": "PET_NPROC_PER_NODE", "value": spec["nprocPerNode"]})
    elastic = spec.get("elasticPolicy")
    if elastic is not None:
        host = elastic.get("rdzvHost", f"{name}-worker-0")
        port = elastic.get("rdzvPort", _port(job, "Worker"))
        env += [
            {"name": "PET_RDZV_ENDPOINT", "value": f"{host}:{port}"},
            {"name": "PET_RDZV_BACKEND", "value": elastic.get("rdzvBackend", "c10d")},
            {"name": "PET_NNODES", "value": f"{elastic['minReplicas']}:{elastic['maxReplicas']}"},
        ]
        if "maxRestarts" in elastic:
            env.append({"name": "PET_MAX_RESTARTS", "value": str(elastic["maxRestarts"])})
        if "nProcPerNode" in elastic:
            env.append({"name": "PET_NPROC_PER_NODE", "value": str(elastic["nProcPerNode"])})
        if "rdzvId" in elastic:
            env.append({"name": "PET_RDZV_ID", "value": elastic["rdzvId"]})
        if elastic.get("rdzvConf"):
            conf = ",".join(f"{c['key']}={c['value']}" for c in elastic["rdzvConf"])
            env.append({"name": "PET_RDZV_CONF", "value": conf})
        if elastic.get("standalone"):
            env.append({"name": "PET_STANDALONE", "value": ""})
    elif version >= (1, 7):
        env.append({"name": "PET_NNODES", "value": str(pods)})
    return env
