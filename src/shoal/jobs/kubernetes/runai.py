"""The Run:ai CLI's submit command for a distributed PyTorch job, for each CLI generation.

Run:ai turns the command into a training-operator PyTorchJob: one master pod plus ``--workers``
worker pods, so ``--workers`` is the number of pods minus one (run-ai/docs,
docs/Researcher/Walkthroughs/walkthrough-distributed-training.md: "one master and two workers" for
``--workers=2``). The generations (flags from run-ai/docs docs/Researcher/cli-reference/):

- ``submit-pytorch``: CLI v1 before 2.13, ``runai submit-pytorch --name N --workers W -g G -i IMAGE``;
- ``submit-dist``: CLI v1 from 2.13, ``runai submit-dist pytorch`` with the same flags;
- ``training``: CLI v2 (clusters 2.18+), ``runai training pytorch submit NAME`` with
  ``--gpu-devices-request``, ``--cpu-core-request``, ``--cpu-memory-request``, ``--existing-pvc``.

What the pod command relies on: the training operator gives every pod MASTER_ADDR
(``<name>-master-0``), MASTER_PORT, RANK (the pod's index, master first) and WORLD_SIZE, and with an
operator before 1.7 nothing else (no PET_*); ``shoal run`` and ``shoal train`` read those as node RANK
of WORLD_SIZE meeting on MASTER_ADDR:MASTER_PORT (:func:`shoal.env.operator.classic_pod`), and the
PET_* variables when a newer operator sets them. The command does not spell them out as
``--nnodes $(WORLD_SIZE)``: from training-operator 1.7 WORLD_SIZE counts processes, not pods, and
PET_NNODES is the count to read then. Run:ai's pods get no PET_NPROC_PER_NODE from the submit command,
so more than one process per pod is asked of ``shoal run --nproc-per-node N`` in the command itself
(without it: one process per GPU, one on CPU). Secrets and read-only volumes
have no flag in these CLIs' documented options: shoal refuses them here (a PyTorchJob from
``shoal launch k8s`` can carry both).
"""

from __future__ import annotations

from shoal.errors import ShoalError
from shoal.jobs.kubernetes import fault_tolerance, template
from shoal.jobs.kubernetes.options import PodOptions
from shoal.jobs.spec import JobSpec

RUNAI_CLIS = ("submit-pytorch", "submit-dist", "training")
"""The CLI generations, oldest first (``shoal launch runai --cli``)."""
RUNAI_LABELS = {
    "submit-pytorch": "Run:ai CLI v1 before 2.13",
    "submit-dist": "Run:ai CLI v1, 2.13 and later",
    "training": "Run:ai CLI v2 (clusters 2.18 and later)",
}


def render_runai(spec: JobSpec, pods: PodOptions, cli: str, project: str | None = None) -> list[str]:
    """The ``runai`` argv submitting ``spec`` on ``pods`` with CLI generation ``cli`` (one of :data:`RUNAI_CLIS`)."""
    if cli not in RUNAI_CLIS:
        raise ShoalError(f"--cli {cli!r} is not a Run:ai CLI generation", f"use one of: {', '.join(RUNAI_CLIS)}")
    template.check(spec, pods)
    fault_tolerance.refuse_kind(spec, "a Run:ai submit command (which cannot create the lighthouse)")
    if spec.nodes < 2:
        raise ShoalError(
            f"--nnodes {spec.nodes}: a Run:ai distributed PyTorch job has a master and at least one worker",
            "give --nnodes 2 or more (or run a single pod with `runai submit`)",
        )
    if pods.secret_env:
        raise ShoalError(
            "--secret-env: the Run:ai submit commands have no flag that references a Kubernetes secret",
            "use `shoal launch k8s --kind pytorchjob` (secretKeyRef), or a Run:ai credential asset",
        )
    if any(v.read_only for v in pods.volumes):
        raise ShoalError("--volume ...:ro: the Run:ai submit commands mount claims read-write", "drop :ro")
    if pods.elastic is not None:
        raise ShoalError("--elastic is not rendered for Run:ai", "use `shoal launch k8s --kind pytorchjob --elastic`")
    nproc = spec.local_world_size
    command = template.pod_command(spec, nproc=nproc if nproc > 1 else None)
    v2 = cli == "training"
    argv = ["runai", "training", "pytorch", "submit", spec.job_name] if v2 else ["runai"]
    if not v2:
        argv += ["submit-pytorch"] if cli == "submit-pytorch" else ["submit-dist", "pytorch"]
        argv += ["--name", spec.job_name]
    if project:
        argv += ["-p", project]
    argv += ["-i", pods.require_image(), "--workers", str(spec.nodes - 1)]
    if spec.gpus_per_node:
        argv += ["--gpu-devices-request" if v2 else "-g", str(spec.gpus_per_node)]
    if pods.cpu:
        argv += ["--cpu-core-request" if v2 else "--cpu", pods.cpu]
    if pods.memory:
        argv += ["--cpu-memory-request" if v2 else "--memory", pods.memory]
    for entry in template.env_entries(spec, pods):
        argv += ["-e", f"{entry['name']}={entry['value']}"]
    for volume in pods.volumes:
        argv += ["--existing-pvc" if v2 else "--pvc-exists", f"claimname={volume.claim},path={volume.mount_path}"]
    # --large-shm: a memory-backed /dev/shm; --backoff-limit: Run:ai's default is 6 retries.
    argv += ["--large-shm", "--backoff-limit", str(spec.max_restarts), "--command", "--", *command]
    return argv
