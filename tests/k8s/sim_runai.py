"""The pods of a Run:ai distributed PyTorch workload, from the ``runai`` submit command shoal renders.

What Run:ai documents (run-ai/docs), applied here:

- docs/Researcher/Walkthroughs/walkthrough-distributed-training.md: a distributed PyTorch workload
  runs on the Kubeflow Training Operator, which the administrator installs as a prerequisite, and
  ``--workers=2`` gives "one master and two workers": the submit command becomes a PyTorchJob
  with one Master and ``--workers`` Workers, so every pod gets what the operator sets
  (:mod:`k8s.sim_pytorchjob`). The operator Run:ai's clusters carry is taken as one before 1.7
  (``version=(1, 6)``): MASTER_ADDR (``<name>-master-0``), MASTER_PORT (23456), RANK (pod index,
  master first) and WORLD_SIZE (the number of pods), and no PET_* at all: the variables Run:ai
  users' launch scripts read (``torchrun --nproc_per_node=$RUNAI_NUM_OF_GPUS --nnodes=$WORLD_SIZE
  --node_rank=$RANK --master_addr=$MASTER_ADDR --master_port=$MASTER_PORT``).
- docs/Researcher/best-practices/env-variables.md: Run:ai adds JOB_NAME, JOB_UUID, POD_INDEX,
  POD_UUID, NODE_NAME, and RUNAI_NUM_OF_GPUS (the GPUs allocated to the container; set here only
  when ``-g``/``--gpu-devices-request`` asks for GPUs).
- docs/Researcher/cli-reference (runai-submit-dist-pytorch.md, new-cli/runai_training_pytorch_submit.md):
  ``--name``, ``-p`` (the project: its namespace is ``runai-<project>``), ``-i``, ``--workers``,
  ``-g``/``--gpu-devices-request``, ``--cpu``/``--cpu-core-request``, ``--memory``/``--cpu-memory-request``,
  ``-e NAME=VALUE``, ``--pvc-exists``/``--existing-pvc claimname=C,path=P``, ``--large-shm``
  (a memory-backed /dev/shm), ``--backoff-limit``, ``--command -- CMD...`` (the container's command).

What is not simulated: Run:ai's scheduler (gang scheduling, quotas, fractions) and the GPUs.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from k8s import sim_pytorchjob
from k8s.sim_cluster import SimPod, SimulationError

OPERATOR_VERSION = (1, 6)
"""The training-operator whose variables Run:ai's pods carry here: WORLD_SIZE = pods, no PET_*."""
_VALUE_FLAGS = {
    "--name",
    "-p",
    "--project",
    "-i",
    "--image",
    "--workers",
    "-g",
    "--gpu-devices-request",
    "--cpu",
    "--cpu-core-request",
    "--memory",
    "--cpu-memory-request",
    "-e",
    "--environment",
    "--pvc-exists",
    "--existing-pvc",
    "--backoff-limit",
}


def parse_submit(argv: Sequence[str]) -> dict[str, Any]:
    """The settings of a ``runai`` submit command (any of shoal's three CLI generations)."""
    argv = list(argv)
    if argv[:2] == ["runai", "submit-pytorch"]:
        rest = argv[2:]
    elif argv[:3] == ["runai", "submit-dist", "pytorch"]:
        rest = argv[3:]
    elif argv[:4] == ["runai", "training", "pytorch", "submit"]:
        rest = ["--name", argv[4], *argv[5:]]
    else:
        raise SimulationError(f"not a Run:ai PyTorch submit command: {argv[:4]}")
    settings: dict[str, Any] = {"env": [], "pvcs": [], "large_shm": False, "command": None}
    i = 0
    while i < len(rest):
        flag = rest[i]
        if flag == "--command":
            if rest[i + 1] != "--":
                raise SimulationError("--command must be followed by -- and the command")
            settings["command"] = rest[i + 2 :]
            break
        if flag == "--large-shm":
            settings["large_shm"] = True
            i += 1
            continue
        if flag not in _VALUE_FLAGS:
            raise SimulationError(f"flag {flag} is not simulated")
        value = rest[i + 1]
        if flag in ("-e", "--environment"):
            name, _, val = value.partition("=")
            settings["env"].append({"name": name, "value": val})
        elif flag in ("--pvc-exists", "--existing-pvc"):
            fields = dict(part.split("=", 1) for part in value.split(","))
            settings["pvcs"].append((fields["claimname"], fields["path"]))
        else:
            settings[flag.lstrip("-")] = value
        i += 2
    if settings["command"] is None:
        raise SimulationError("no --command: the image's entry point is not simulated")
    return settings


def pytorchjob(argv: Sequence[str]) -> dict[str, Any]:
    """The PyTorchJob Run:ai creates for the submit command ``argv``."""
    s = parse_submit(argv)
    name = s["name"]
    project = s.get("p") or s.get("project") or "default"
    gpus = s.get("g") or s.get("gpu-devices-request")
    volumes = [{"name": f"pvc-{n}", "persistentVolumeClaim": {"claimName": c}} for n, (c, _) in enumerate(s["pvcs"])]
    mounts = [{"name": f"pvc-{n}", "mountPath": path} for n, (_, path) in enumerate(s["pvcs"])]
    if s["large_shm"]:
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    resources = {"limits": {"nvidia.com/gpu": gpus}} if gpus else {}

    def replica(count: int) -> dict[str, Any]:
        container = {
            "name": sim_pytorchjob.CONTAINER,
            "image": s.get("i") or s.get("image"),
            "command": list(s["command"]),
            "env": list(s["env"]),
            "volumeMounts": mounts,
            "resources": resources,
        }
        return {"replicas": count, "template": {"spec": {"containers": [container], "volumes": volumes}}}

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": f"runai-{project}"},
        "spec": {
            "runPolicy": {"backoffLimit": int(s.get("backoff-limit", 6))},
            "pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(int(s["workers"]))},
        },
    }


def simulate(argv: Sequence[str]) -> list[SimPod]:
    """Every pod of the workload ``argv`` submits, master first, with Run:ai's variables added."""
    job = pytorchjob(argv)
    gpus = parse_submit(argv).get("g") or parse_submit(argv).get("gpu-devices-request")
    pods = sim_pytorchjob.simulate(job, version=OPERATOR_VERSION)
    job_uuid = str(uuid.uuid4())
    for index, pod in enumerate(pods):
        runai = {
            "JOB_NAME": job["metadata"]["name"],
            "JOB_UUID": job_uuid,
            "POD_INDEX": str(index),
            "POD_UUID": str(uuid.uuid4()),
            "NODE_NAME": f"node-{index}",
        }
        if gpus:
            runai["RUNAI_NUM_OF_GPUS"] = str(gpus)
        pod.env = {**runai, **pod.env}
    return pods
