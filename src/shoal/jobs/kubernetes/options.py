"""The Kubernetes target's options: what a job needs on pods beyond what it runs: image, resources,
volumes, secrets, elasticity, grace period.

A :class:`PodOptions` goes beside a :class:`~shoal.jobs.spec.JobSpec` to the renderers of
:mod:`shoal.jobs.kubernetes` that write Kubernetes objects (PyTorchJob, TrainJob, MPIJob) and Run:ai
submit commands. Everything is checked here, before anything is rendered
or written, with the rules Kubernetes itself applies:

- names: a job name is a DNS-1035 label (it becomes Service and pod host names, see
  :func:`check_job_name`), claims and secrets DNS-1123 subdomains, the namespace a DNS-1123 label;
- quantities (``--cpu 4``, ``--memory 16Gi``, ``--shm-size 8Gi``) match the API's quantity syntax;
- secrets travel by reference only (``secretKeyRef``): an ``--env`` whose name says it holds a secret
  (``*_TOKEN``, ``*_KEY``, ``*PASSWORD*``, ``*SECRET*``) is refused, and its value is never echoed;
- the training command's own flags agree with the pod: no GPUs with ``--device cpu``, and a
  termination grace period long enough for ``--preempt-grace`` (:func:`grace_period`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shoal.env.grace import EXIT_MARGIN_S, PLATFORM_GRACE_S, PREEMPT_GRACE_S
from shoal.errors import ShoalError
from shoal.jobs.spec import looks_secret, shoal_train_args, train_option

DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
QUANTITY = re.compile(
    r"(\+)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?"
)
"""A positive resource quantity, as the API's ``resource.Quantity`` pattern accepts it (no sign)."""
SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
SHM_MOUNT = "/dev/shm"


@dataclass(frozen=True)
class SecretEnv:
    """An environment variable read from a Kubernetes secret: ``NAME=secret:key``."""

    name: str
    secret: str
    key: str


@dataclass(frozen=True)
class VolumeClaim:
    """A PersistentVolumeClaim mounted on every pod: ``claim:/mount/path[:ro]``."""

    claim: str
    mount_path: str
    read_only: bool = False


@dataclass(frozen=True, kw_only=True)
class PodOptions:
    """How every pod of a job is built: image, resources, volumes, secrets, elasticity, grace."""

    image: str | None = None
    """The container image (with shoal and the user's code in it; ``shoal launch image`` writes one)."""
    namespace: str = "default"
    cpu: str | None = None
    """CPU request of every pod (a quantity: ``4``, ``500m``)."""
    memory: str | None = None
    """Memory request and limit of every pod (``16Gi``)."""
    secret_env: tuple[SecretEnv, ...] = ()
    volumes: tuple[VolumeClaim, ...] = ()
    shm_size: str | None = None
    """Size limit of the memory-backed /dev/shm (default: none, bounded by the pod's memory)."""
    elastic: tuple[int, int] | None = None
    """Elastic PyTorchJob: (min, max) pods; the job keeps running while at least min are up."""
    grace_period_s: int | None = None
    """terminationGracePeriodSeconds; default from the command's ``--preempt-grace`` (see :func:`grace_period`)."""

    def __post_init__(self) -> None:
        if self.image is not None and (not self.image.strip() or any(c.isspace() for c in self.image)):
            raise ShoalError(
                f"--image {self.image!r} is not an image reference", "give e.g. --image ghcr.io/me/train:1"
            )
        if not DNS1123_LABEL.fullmatch(self.namespace) or len(self.namespace) > 63:
            raise ShoalError(
                f"--namespace {self.namespace!r} is not a Kubernetes namespace name",
                "use lowercase letters, digits and '-', at most 63 characters",
            )
        for flag, value in (("--cpu", self.cpu), ("--memory", self.memory), ("--shm-size", self.shm_size)):
            if value is not None and (not QUANTITY.fullmatch(value) or _is_zero(value)):
                raise ShoalError(
                    f"{flag} {value!r} is not a positive Kubernetes quantity", "write e.g. --cpu 4, --memory 16Gi"
                )
        names = [s.name for s in self.secret_env]
        for secret in self.secret_env:
            _check_env_name(secret.name, "--secret-env")
            if not DNS1123_SUBDOMAIN.fullmatch(secret.secret) or len(secret.secret) > 253:
                raise ShoalError(
                    f"--secret-env {secret.name}: {secret.secret!r} is not a secret name",
                    "write --secret-env NAME=SECRET:KEY with the name of a Kubernetes secret (lowercase)",
                )
            if not SECRET_KEY.fullmatch(secret.key):
                raise ShoalError(f"--secret-env {secret.name}: {secret.key!r} is not a secret key", SECRET_HINT)
        if len(set(names)) != len(names):
            raise ShoalError("--secret-env gives a variable twice", "give each variable once")
        paths = [v.mount_path for v in self.volumes]
        for volume in self.volumes:
            if not DNS1123_SUBDOMAIN.fullmatch(volume.claim) or len(volume.claim) > 253:
                raise ShoalError(f"--volume: {volume.claim!r} is not a claim name", VOLUME_HINT)
            if not volume.mount_path.startswith("/") or volume.mount_path.rstrip("/") in ("", SHM_MOUNT):
                raise ShoalError(
                    f"--volume {volume.claim}:{volume.mount_path}: the mount path must be absolute and not / or {SHM_MOUNT}",
                    VOLUME_HINT,
                )
        if len(set(paths)) != len(paths):
            raise ShoalError("two --volume flags mount at the same path", "give each volume its own mount path")
        if self.elastic is not None:
            low, high = self.elastic
            if not 1 <= low <= high:
                raise ShoalError(f"--elastic {low}:{high}: need 1 <= MIN <= MAX", "write --elastic MIN:MAX, e.g. 2:4")
        if self.grace_period_s is not None and self.grace_period_s < 1:
            raise ShoalError(f"--grace-period {self.grace_period_s} must be at least 1 s", "give seconds, e.g. 60")

    def require_image(self) -> str:
        if not self.image:
            raise ShoalError(
                "no image given: every pod runs a container image",
                "give --image REGISTRY/NAME:TAG (`shoal launch image -- ...` writes a Dockerfile for one)",
            )
        return self.image


SECRET_HINT = "write --secret-env NAME=SECRET:KEY (a variable NAME read from key KEY of Kubernetes secret SECRET)"
VOLUME_HINT = "write --volume CLAIM:/mount/path (add :ro for read-only), CLAIM an existing PersistentVolumeClaim"


def _is_zero(quantity: str) -> bool:
    digits = re.match(r"\+?([0-9.]*)", quantity).group(1)  # type: ignore[union-attr]
    return not digits.strip(".") or float(digits) == 0


def _check_env_name(name: str, flag: str) -> None:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ShoalError(
            f"{flag} {name!r} is not a variable name", "use NAME=VALUE with NAME made of letters, digits, _"
        )


# ---- parsing the command line ----------------------------------------------------------------


def parse_secret_env(items: Sequence[str] | None) -> tuple[SecretEnv, ...]:
    """``--secret-env NAME=SECRET:KEY`` (repeatable)."""
    out = []
    for item in items or ():
        name, sep, ref = item.partition("=")
        secret, colon, key = ref.partition(":")
        if not sep or not colon or not name or not secret or not key:
            raise ShoalError(f"--secret-env {item!r} is malformed", SECRET_HINT)
        out.append(SecretEnv(name, secret, key))
    return tuple(out)


def parse_volumes(items: Sequence[str] | None) -> tuple[VolumeClaim, ...]:
    """``--volume CLAIM:/mount/path[:ro]`` (repeatable)."""
    out = []
    for item in items or ():
        claim, sep, rest = item.partition(":")
        path, _, mode = rest.partition(":")
        if not sep or not claim or not path or mode not in ("", "ro", "rw"):
            raise ShoalError(f"--volume {item!r} is malformed", VOLUME_HINT)
        out.append(VolumeClaim(claim, path, read_only=mode == "ro"))
    return tuple(out)


def parse_elastic(text: str | None) -> tuple[int, int] | None:
    """``--elastic MIN:MAX``."""
    if text is None:
        return None
    low, sep, high = text.partition(":")
    if not sep or not low.isdigit() or not high.isdigit():
        raise ShoalError(f"--elastic {text!r} is not MIN:MAX", "write --elastic MIN:MAX, e.g. --elastic 2:4")
    return int(low), int(high)


# ---- rules a job on pods must follow -----------------------------------------------------------


def check_job_name(name: str, derived: Sequence[str] = ()) -> None:
    """``name`` and the names the operator derives from it (Services, pod host names) must be
    DNS-1035 labels: lowercase letters, digits and '-', starting with a letter, at most 63 characters."""
    hint = "use lowercase letters, digits and '-', starting with a letter, e.g. --name digits-ddp"
    if not DNS1035_LABEL.fullmatch(name) or len(name) > 63:
        raise ShoalError(f"job name {name!r} is not a DNS-1035 label, which Kubernetes requires", hint)
    for other in derived:
        if len(other) > 63:
            raise ShoalError(
                f"job name {name!r} is too long: the operator names a Service or pod {other!r} "
                f"({len(other)} characters, at most 63)",
                f"give a name of at most {63 - (len(other) - len(name))} characters",
            )


def pod_env(env: Sequence[tuple[str, str | None]], environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """``--env`` pairs with their values (``NAME`` alone: this shell's value), refusing secrets in clear."""
    out = []
    for name, value in env:
        if looks_secret(name):
            raise ShoalError(
                f"--env {name} looks like a secret: its value would be written into the manifest in clear",
                f"store it in a Kubernetes secret (kubectl create secret generic NAME --from-literal=KEY=...) "
                f"and pass --secret-env {name}=NAME:KEY",
            )
        if value is None:
            if name not in environ:
                raise ShoalError(f"--env {name}: not set in this shell", f"give --env {name}=VALUE")
            value = environ[name]
        out.append((name, value))
    return out


def check_devices(command: Sequence[str], gpus_per_node: int) -> None:
    """No GPUs requested for a ``shoal train --device cpu`` job, and none missing for ``--device cuda``."""
    device = train_option(command, "--device")
    if device == "cpu" and gpus_per_node > 0:
        raise ShoalError(
            f"--gpus-per-node {gpus_per_node} requested, but the command trains with --device cpu",
            "drop --gpus-per-node (CPU pods), or --device cpu from the command",
        )
    if device == "cuda" and gpus_per_node == 0:
        raise ShoalError(
            "the command trains with --device cuda, but no GPU is requested",
            "give --gpus-per-node N (one process per GPU), or drop --device cuda",
        )


def grace_period(command: Sequence[str], explicit: int | None) -> int:
    """terminationGracePeriodSeconds for pods running ``command``.

    For ``shoal train`` it must cover ``--preempt-grace`` (default 25 s) plus :data:`EXIT_MARGIN_S`,
    so that SIGTERM on eviction ends in a checkpoint rather than a SIGKILL mid-save. An explicit
    ``--grace-period`` shorter than that is an error.
    """
    if shoal_train_args(command) is None:
        return explicit or PLATFORM_GRACE_S
    text = train_option(command, "--preempt-grace")
    try:
        preempt = float(text) if text is not None else PREEMPT_GRACE_S
    except ValueError:
        raise ShoalError(
            f"--preempt-grace {text!r} is not a number of seconds", "give e.g. --preempt-grace 25"
        ) from None
    needed = math.ceil(preempt) + EXIT_MARGIN_S
    if explicit is None:
        return needed
    if explicit < needed:
        raise ShoalError(
            f"--grace-period {explicit} s is shorter than the command's --preempt-grace {preempt:g} s "
            f"+ {EXIT_MARGIN_S} s: Kubernetes would kill the pods before the preemption checkpoint is written",
            f"give --grace-period {needed} or more, or a shorter --preempt-grace",
        )
    return explicit
