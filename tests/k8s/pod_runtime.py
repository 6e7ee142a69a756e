"""Run the pods an operator simulation produced: each :class:`SimPod` as a pod of :mod:`cluster.pods`.

What the kubelet and the container runtime would do, done here:

- names: each pod resolves every name the cluster's DNS would answer for it
  (:func:`k8s.sim_cluster.resolvable_names`), through its own /etc/hosts;
- host name: the pod's ``hostname``;
- volumes: a PersistentVolumeClaim is a directory of the test (``claims``), shared by every pod that
  mounts it, as a ReadWriteMany volume is; an ``emptyDir`` with ``medium: Memory`` a fresh tmpfs
  (``sizeLimit`` as its size); a plain ``emptyDir`` a directory of the pod; a ConfigMap the files the
  operator generated (:attr:`SimPod.files`); a Secret the test's secret data, with its items' paths
  and ``defaultMode``;
- the image: this machine's file system, with the virtual environment's ``bin`` first on PATH (as the
  image rendered by ``shoal launch image`` has shoal on PATH), plus the files the rendered image
  adds (``image_files``: for an MPIJob, the SSH settings of ``shoal launch image --mpi``). :func:`container_env` is the
  environment a process of the main container starts with: the image's, then the container's own.

The container's command is run exactly as the pod says (:attr:`SimPod.argv`), by the test.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from cluster.pods import Mount, PodNetwork, PodSpec, pod_network
from k8s.sim_cluster import SimPod, resolvable_names
from shoal.jobs.kubernetes.image import MPI_SSH_CONFIG, MPI_SSHD_CONFIG

IMAGE_PATH = os.pathsep.join(
    [os.path.dirname(sys.executable), "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
)
IMAGE_ENV = {
    "PATH": IMAGE_PATH,
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "PYTHONUNBUFFERED": "1",
    # The pytorch/pytorch images set it; mpirun's `-x LD_LIBRARY_PATH` forwards it.
    "LD_LIBRARY_PATH": "/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
}
"""The environment the simulated image gives every process (Dockerfile ENV lines and the runtime's)."""
MPI_IMAGE_FILES = dict([MPI_SSH_CONFIG, MPI_SSHD_CONFIG])
"""What ``shoal launch image --mpi`` adds to /etc (the SSH settings the MPI operator's images carry)."""


def container_env(pod: SimPod, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a process the container starts: the image's, HOSTNAME, then the pod's own."""
    return {**IMAGE_ENV, "HOSTNAME": pod.hostname, **pod.env, **(extra or {})}


def pod_mounts(
    pod: SimPod,
    workdir: Path,
    *,
    claims: Mapping[str, Path],
    secrets: Mapping[str, Mapping[str, str]],
) -> list[Mount]:
    """The mounts of ``pod``'s main container, with the files behind them written under ``workdir``."""
    mounts = []
    for path, volume in pod.mounts().items():
        read_only = any(m.get("readOnly") for m in pod.container.get("volumeMounts", []) if m["mountPath"] == path)
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            if claim not in claims:
                raise KeyError(f"pod {pod.name}: claim {claim} has no directory in this test")
            mounts.append(Mount(path, str(claims[claim]), read_only=read_only))
        elif "emptyDir" in volume:
            if volume["emptyDir"].get("medium") == "Memory":
                mounts.append(Mount(path, None, size=_tmpfs_size(volume["emptyDir"].get("sizeLimit"))))
            else:
                directory = workdir / pod.name / f"emptydir-{volume['name']}"
                directory.mkdir(parents=True, exist_ok=True)
                mounts.append(Mount(path, str(directory)))
        elif "configMap" in volume:
            directory = workdir / pod.name / f"configmap-{volume['name']}"
            directory.mkdir(parents=True, exist_ok=True)
            for item in volume["configMap"]["items"]:
                file = directory / item["path"]
                file.write_text(pod.files[f"{path}/{item['path']}"])
                file.chmod(item.get("mode", 0o644))
            mounts.append(Mount(path, str(directory), read_only=True))
        elif "secret" in volume:
            source = volume["secret"]
            data = secrets[source["secretName"]]
            directory = workdir / pod.name / f"secret-{volume['name']}"
            directory.mkdir(parents=True, exist_ok=True)
            for item in source.get("items") or [{"key": k, "path": k} for k in data]:
                file = directory / item["path"]
                file.write_text(data[item["key"]])
                file.chmod(item.get("mode", source.get("defaultMode", 0o644)))
            mounts.append(Mount(path, str(directory), read_only=True))
        else:
            raise NotImplementedError(f"pod {pod.name}: volume {volume['name']} of this kind is not simulated")
    return mounts


@contextmanager
def run_pods(
    pods: Sequence[SimPod],
    workdir: Path,
    *,
    claims: Mapping[str, Path] | None = None,
    secrets: Mapping[str, Mapping[str, str]] | None = None,
    image_files: Mapping[str, str] | None = None,
    tag: str = "",
) -> Iterator[PodNetwork]:
    """Start ``pods`` (their sandboxes: network, names, host names, volumes), indexed by pod name.

    ``image_files``: files the image holds beyond this machine's (path -> text), such as the MPI
    image's SSH settings (:data:`MPI_IMAGE_FILES`).
    """
    extra = []
    for n, (path, text) in enumerate(sorted((image_files or {}).items())):
        file = workdir / "image" / f"{n}-{Path(path).name}"
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(text)
        extra.append(Mount(path, str(file), read_only=True))
    specs = [
        PodSpec(
            name=pod.name,
            hostname=pod.hostname,
            resolves=resolvable_names(pods, pod),
            search=pod.search,
            mounts=[*extra, *pod_mounts(pod, workdir, claims=claims or {}, secrets=secrets or {})],
        )
        for pod in pods
    ]
    with pod_network(specs, tag=tag) as network:
        yield network


def _tmpfs_size(limit: str | None) -> str | None:
    """A Kubernetes quantity (``1Gi``) as a tmpfs size (``1g``)."""
    if limit is None:
        return None
    units = {"Ki": "k", "Mi": "m", "Gi": "g", "Ti": "t"}
    for suffix, unit in units.items():
        if limit.endswith(suffix):
            return limit[: -len(suffix)] + unit
    return limit
