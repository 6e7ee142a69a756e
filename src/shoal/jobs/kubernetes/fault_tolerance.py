"""A fault-tolerant job on Kubernetes: the torchft lighthouse as its own Deployment and Service,
beside a PyTorchJob or a TrainJob, whichever kind runs the pods.

A pod command ``shoal train ... --fault-tolerance`` makes every pod of the job a node of replica
groups (``docs/FAULT_TOLERANCE.md``): node PET_NODE_RANK of PET_NNODES, read from the variables both
operators set (the training operator for a PyTorchJob, Trainer's torch plugin for a TrainJob), its
groups numbered ``RANK x groups per pod`` on. The pod's launcher forks its groups and restarts one
that dies; a pod whose container dies comes back as the kubelet restarts it (restartPolicy
OnFailure) or its controller recreates the pod, and its groups heal from a live one. How each kind
gets there, and what bounds the restarts, is the kind's (:mod:`.pytorchjob`, :mod:`.trainjob`).

The lighthouse, torchft's quorum server, must outlive any one group, so it is not the master pod's
(a lost master pod would take the quorum with it and stall every survivor) nor its sidecar (the
same, and a container that never exits keeps the master pod, and so the job, from completing). It
is what torchft's own launch examples make it, a process of its own beside the groups
(pytorch/torchft 0.2.0, torchft/torchx.py: "This must be run externally"), here:

- a ``Deployment`` of one pod (``<name>-lighthouse``, the job's image, ``torchft_lighthouse``),
  ``strategy: Recreate`` so that an update never runs two lighthouses (two quorums would train
  apart), bound to the pod's own address (``$(POD_IP)`` from the downward API; never ``[::]``,
  torchft's default), shoal's settings (1 s heartbeat timeout, 30 s join timeout, a quorum of
  one group at least: :mod:`shoal.train.ft.lighthouse`), a TCP readiness probe;
- a ``Service`` of the same name: a stable address for it while its pod is replaced;
- each pod of the job gets ``--lighthouse http://<name>-lighthouse:29510`` in its command (a
  command that names a ``--lighthouse`` already keeps it, and no lighthouse is rendered).

:func:`prepare` is the one place that adds that URL, and it returns the Deployment and Service in
the same call: a kind cannot render pods that name a lighthouse nobody applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shoal.env.replica import lighthouse_args
from shoal.errors import ShoalError
from shoal.jobs.kubernetes.options import PodOptions, check_job_name, train_option
from shoal.jobs.spec import JobSpec, fault_tolerant

LIGHTHOUSE_PORT = 29510
"""torchft's own lighthouse port (``torchft_lighthouse --bind`` default, TORCHFT_LIGHTHOUSE in its examples)."""
PORT_NAME = "lighthouse"
"""The container port's name (an IANA service name: at most 15 characters), the Service's target."""
CONTAINER = "lighthouse"
MIN_RESTARTS = 10
"""``--max-restarts`` of a fault-tolerant PyTorchJob when none is given: a pod whose container
restarts counts against the job's runPolicy.backoffLimit, and a lost group comes back that way."""
REQUESTS = {"cpu": "100m", "memory": "512Mi"}
"""The lighthouse pod's requests: one process, mostly asleep; torchft's script imports torch (a few
hundred MB). No limit: a lighthouse killed for memory would stall every group."""


def lighthouse_name(spec: JobSpec) -> str:
    """The Deployment's and the Service's name (also the host name the pods reach it at)."""
    return f"{spec.job_name}-lighthouse"


def lighthouse_url(spec: JobSpec) -> str:
    """What the pods connect to: the Service's name, resolved in the job's namespace."""
    return f"http://{lighthouse_name(spec)}:{LIGHTHOUSE_PORT}"


def own_lighthouse(command: Sequence[str]) -> bool:
    """True when the command names its own ``--lighthouse`` (nothing is rendered for it then)."""
    return train_option(command, "--lighthouse") is not None


def refuse_kind(spec: JobSpec, kind: str) -> None:
    """A fault-tolerant command rendered as a kind that cannot run it (``kind``: "an MPIJob"...)."""
    if fault_tolerant(spec.command):
        raise ShoalError(
            f"--fault-tolerance is rendered as a PyTorchJob or a TrainJob beside its lighthouse, not as {kind}",
            "use `shoal launch k8s --kind pytorchjob` or `--kind trainjob` (their pods restart one at a time)",
        )


def check(spec: JobSpec, pods: PodOptions) -> None:
    """What a fault-tolerant job on pods cannot be, whatever its kind, refused before anything is rendered."""
    if spec.nodes < 2:
        raise ShoalError(
            f"--fault-tolerance with --nodes {spec.nodes}: a lost pod would take every replica group with it",
            "give --nodes 2 or more: each pod is a replica group that the others train on without",
        )
    if pods.elastic is not None:
        raise ShoalError(
            "--elastic restarts every pod when one fails; --fault-tolerance keeps the others training",
            "drop --elastic (a fault-tolerant job's groups come and go on their own)",
        )
    if spec.gpus_per_node:
        raise ShoalError(
            "--fault-tolerance runs on the CPU for now, but --gpus-per-node asks for GPUs",
            "drop --gpus-per-node (docs/FAULT_TOLERANCE.md says what is built)",
        )
    out = train_option(spec.command, "--out")
    mounted = [v.mount_path.rstrip("/") for v in pods.volumes if not v.read_only]
    if out is None or not any(out == path or out.startswith(path + "/") for path in mounted):
        raise ShoalError(
            f"--fault-tolerance on pods writes its run to {out or 'a directory of each pod'}, which no writable "
            "--volume holds: a restarted group's records and checkpoints would be lost",
            "mount a ReadWriteMany claim on every pod (--volume CLAIM:/mnt/shared) and pass --out /mnt/shared/run",
        )


def prepare(spec: JobSpec, pods: PodOptions, command: list[str]) -> tuple[list[str], list[dict[str, Any]]]:
    """The pods' command and the objects to apply before the job, for a job of any kind whose pods
    run ``command`` (the job's command as the kind runs it).

    Not fault-tolerant: ``command``, nothing beside it. Fault-tolerant: checked (:func:`check`);
    naming its own ``--lighthouse``: ``command``, nothing beside it; else ``command`` with the
    rendered lighthouse's URL, and that lighthouse's Deployment and Service (applied first, so that
    the name resolves when the job's pods start).
    """
    if not fault_tolerant(spec.command):
        return command, []
    check(spec, pods)
    if own_lighthouse(spec.command):
        return command, []
    check_job_name(spec.job_name, [lighthouse_name(spec)])
    return [*command, "--lighthouse", lighthouse_url(spec)], render_lighthouse(spec, pods)


def job_alone(objects: list[dict[str, Any]], renderer: str) -> dict[str, Any]:
    """The job, when ``objects`` (a kind's ``render_objects``) hold nothing else; ShoalError when a
    lighthouse was rendered beside it: the job alone would name a lighthouse nobody applies."""
    if len(objects) > 1:
        raise ShoalError(
            f"{renderer} renders the job alone, but this fault-tolerant job's pods name the lighthouse "
            "rendered beside it",
            "render it with render_objects (what `shoal launch k8s` applies): the lighthouse, then the job",
        )
    return objects[0]


def lighthouse_command(groups: int | None = None) -> list[str]:
    """torchft's lighthouse on the pod's address, with the settings of the one shoal runs itself for
    a job of ``groups`` replica groups (None: up to 256)."""
    return ["torchft_lighthouse", *lighthouse_args(f"$(POD_IP):{LIGHTHOUSE_PORT}", groups=groups)]


def render_lighthouse(spec: JobSpec, pods: PodOptions) -> list[dict[str, Any]]:
    """The lighthouse's Deployment and Service for ``spec`` on ``pods``."""
    name = lighthouse_name(spec)
    selector = {"app.kubernetes.io/name": "torchft-lighthouse", "app.kubernetes.io/instance": name}
    labels = {**selector, "app.kubernetes.io/part-of": spec.job_name, "app.kubernetes.io/managed-by": "shoal"}
    metadata = {"name": name, "namespace": pods.namespace, "labels": labels}

    container = {
        "name": CONTAINER,
        "image": pods.require_image(),
        # At most one group per process: the timeout for a job of that many groups (env.replica.heartbeat_ms).
        "command": lighthouse_command(spec.nodes * spec.local_world_size),
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "RUST_LOG", "value": "warn"},  # torchft logs every quorum at info: one line a step
        ],
        "ports": [{"name": PORT_NAME, "containerPort": LIGHTHOUSE_PORT}],
        "readinessProbe": {"tcpSocket": {"port": PORT_NAME}, "periodSeconds": 2},
        "resources": {"requests": dict(REQUESTS)},
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "selector": selector,
            "ports": [{"name": PORT_NAME, "port": LIGHTHOUSE_PORT, "targetPort": PORT_NAME}],
        },
    }
    return [deployment, service]
