"""A Dockerfile and a .dockerignore for the job's container image, shoal as the entry point.

The image starts from a PyTorch base image, installs shoal and the user's requirements, copies the
build context (the script and what it imports; .dockerignore keeps out virtual environments, run
directories, VCS data and ``.env`` files) and makes ``shoal`` the entry point, so a pod's command is
``shoal train ...`` or ``shoal run SCRIPT.py``: no launch script. ``mpi=True`` adds Open MPI and an
SSH server and client configured as the MPI operator's launcher and workers need them (host keys
not checked, since every pod is new; no strict modes, since the key is a mounted secret).
"""

from __future__ import annotations

import json
import os
import re
import shlex

from shoal.errors import ShoalError
from shoal.jobs.kubernetes.template import pod_command
from shoal.jobs.spec import JobSpec, fault_tolerant

IMAGE_MARKER = "# Rendered by `shoal launch image`"
HOROVOD_SHIM_ENV = "SHOAL_HOROVOD_SHIM"
"""shoal.launch.exit_hook.HOROVOD_SHIM_ENV: set in the image, every ``shoal run`` worker resolves the shim."""
DEFAULT_BASE_IMAGE = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"
"""The base image Kubeflow Trainer's torch-distributed runtime uses (kubeflow/trainer, 8c0f505)."""
WORKDIR = "/workspace"
MPI_SSH_CONFIG = (
    "/etc/ssh/ssh_config.d/mpi.conf",
    "Host *\n    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n",
)
"""The MPI image's SSH client settings: every pod is new, so its host key cannot be known in advance."""
MPI_SSHD_CONFIG = ("/etc/ssh/sshd_config.d/mpi.conf", "StrictModes no\n")
"""The MPI image's SSH server settings: the key is a mounted Secret, whose file modes sshd must not judge."""
DOCKERIGNORE = (
    ".git",
    ".venv",
    "venv",
    "**/__pycache__",
    "**/*.pyc",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
    "*.egg-info",
    ".ipynb_checkpoints",
    "runs",
    "checkpoints",
    ".env",
    "*.sbatch",
    "Dockerfile",
    ".dockerignore",
)


def render_dockerfile(
    spec: JobSpec,
    *,
    base_image: str = DEFAULT_BASE_IMAGE,
    shoal_requirement: str = "shoal",
    requirements: str | None = None,
    mpi: bool = False,
    notes: tuple[str, ...] = (),
) -> str:
    """The Dockerfile of an image that runs ``spec.command`` from ``/workspace``.

    ``shoal_requirement``: a pip requirement, a wheel of the build context (copied in first), or
    ``.`` when the build context is shoal's own checkout (installed from the copy); a fault-tolerant
    command's image installs it with torchft (``shoal[ft]``). ``notes``: what the image assumes that
    differs from the machine that rendered it, as comments at its top."""
    _check_in_context(spec)
    _check_word(base_image, "--base-image", "an image reference such as " + DEFAULT_BASE_IMAGE)
    _check_word(shoal_requirement, "--shoal-requirement", "a pip requirement such as shoal==0.1.0 or a wheel's path")
    if requirements is not None:
        _check_relative(requirements, "--requirements")
    lines = [
        f"{IMAGE_MARKER}: the image every pod of the job runs, shoal as its entry point.",
        "# Build it from this directory and push it where the cluster pulls from:",
        "#   docker build -t REGISTRY/NAME:TAG . && docker push REGISTRY/NAME:TAG",
        *(f"# NOTE: {note}" for note in notes),
        f"FROM {base_image}",
        "",
    ]
    if mpi:
        lines += [
            "# Open MPI and SSH for the MPI operator: the launcher's mpirun reaches the workers' sshd with the",
            "# key the operator mounts; pods are new each time, so host keys are not checked.",
            "RUN apt-get update \\",
            "    && apt-get install -y --no-install-recommends openmpi-bin openssh-server openssh-client \\",
            "    && rm -rf /var/lib/apt/lists/* \\",
            "    && mkdir -p /run/sshd \\",
            f"    && printf {_printf(MPI_SSH_CONFIG[1])} > {MPI_SSH_CONFIG[0]} \\",
            f"    && printf {_printf(MPI_SSHD_CONFIG[1])} > {MPI_SSHD_CONFIG[0]}",
            "",
        ]
    lines += ["ENV PYTHONUNBUFFERED=1"]
    for name, value in spec.env:
        if name == HOROVOD_SHIM_ENV:
            lines.append("# `import horovod...` loads shoal.horovod's modules, from the shoal installed below.")
        if value is not None:
            plain = re.fullmatch(r"[\w./:,@+-]*", value) is not None
            lines.append(f"ENV {name}={value if plain else json.dumps(value)}")
    lines.append(f"WORKDIR {WORKDIR}")
    from_context = shoal_requirement == "."  # this directory is shoal's checkout: installed from the copy
    if _is_local_file(shoal_requirement):  # a wheel or sdist of the build context: copied first
        _check_relative(shoal_requirement, "--shoal-requirement")
        lines.append(f"COPY {shoal_requirement} ./{os.path.basename(shoal_requirement)}")
        shoal_requirement = f"./{os.path.basename(shoal_requirement)}"
    extras = ("ft",) if fault_tolerant(spec.command) else ()  # --fault-tolerance needs torchft in every pod
    shoal_requirement = with_extras(shoal_requirement, extras)
    install = ["pip", "install", "--no-cache-dir"] + ([] if from_context else [shoal_requirement])
    if requirements is not None:
        lines.append(f"COPY {requirements} ./{os.path.basename(requirements)}")
        install += ["-r", os.path.basename(requirements)]
    if len(install) > 3:
        lines.append(f"RUN {shlex.join(install)}")
    lines.append("COPY . ./")
    if from_context:
        lines.append(f"RUN {shlex.join(['pip', 'install', '--no-cache-dir', shoal_requirement])}")
    lines += ["", 'ENTRYPOINT ["shoal"]']
    lines.append(f"CMD {json.dumps(pod_command(spec)[1:])}")
    return "\n".join(lines) + "\n"


_NOT_PACKAGED = (
    ".git", ".venv", "venv", "build", "dist", "__pycache__", "*.egg-info", "*.pyc", "*.whl", "tests", "benchmarks",
    "docs", "examples", "runs", ".pytest_cache", ".ruff_cache", ".mypy_cache", "Dockerfile", ".dockerignore",
)  # fmt: skip
"""What a copy of shoal's checkout leaves out before its wheel is built: nothing a wheel holds."""


def wheel_name(version: str) -> str:
    """The file name of shoal's wheel of ``version`` (pure Python: one wheel for every platform)."""
    return f"shoal-{version}-py3-none-any.whl"


def build_wheel(checkout: str, directory: str) -> str:
    """Build a wheel of shoal's checkout ``checkout`` into ``directory`` (the build context); return
    its file name. The checkout is copied first (setuptools builds in the source tree: the user's
    checkout is left as it was), and built with this Python's pip and build backend, offline."""
    import shutil
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix="shoal-wheel-") as tmp:
        source, out = os.path.join(tmp, "shoal"), os.path.join(tmp, "out")
        shutil.copytree(checkout, source, ignore=shutil.ignore_patterns(*_NOT_PACKAGED), symlinks=True)
        argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", out, source]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        wheels = [name for name in os.listdir(out) if name.endswith(".whl")] if os.path.isdir(out) else []
        if proc.returncode != 0 or len(wheels) != 1:
            why = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
            raise ShoalError(
                f"could not build a wheel of shoal's checkout {checkout} for the image: {why}",
                f"build one yourself (pip wheel --no-deps -w . {checkout}) and pass --shoal-requirement with "
                "its file name, or run shoal launch image in the checkout",
            )
        os.replace(os.path.join(out, wheels[0]), os.path.join(directory, wheels[0]))
    return wheels[0]


def with_extras(requirement: str, extras: tuple[str, ...]) -> str:
    """``requirement`` (a name with a version, a file, ``.``) with shoal's ``extras`` added to those
    it names: ``shoal==0.1.0`` -> ``shoal[ft]==0.1.0``, ``.`` -> ``.[ft]``."""
    if not extras:
        return requirement
    match = re.fullmatch(r"(.*?)(?:\[([^\]]*)\])?((?:[=<>!~;@].*)?)", requirement)
    assert match is not None  # the pattern matches every string
    where, named, rest = match.groups()
    if not re.fullmatch(r"[\w./-]+", where):
        return requirement  # not a name or a path (a URL alone): as given
    have = [e.strip() for e in (named or "").split(",") if e.strip()]
    return f"{where}[{','.join(have + [e for e in extras if e not in have])}]{rest}"


def _is_local_file(requirement: str) -> bool:
    return requirement.endswith((".whl", ".tar.gz", ".zip")) and "://" not in requirement


def base_image_torch(base_image: str) -> str | None:
    """The torch version a ``pytorch/pytorch:X.Y.Z-...`` base image holds (None for other images)."""
    match = re.fullmatch(r"(?:docker\.io/)?pytorch/pytorch:(\d+\.\d+\.\d+)(?:-.*)?", base_image)
    return match.group(1) if match else None


def render_dockerignore() -> str:
    """What the build context leaves out of the image."""
    return f"{IMAGE_MARKER}: kept out of the build context.\n" + "\n".join(DOCKERIGNORE) + "\n"


def _check_in_context(spec: JobSpec) -> None:
    first = spec.command[0]
    script = spec.command[1] if os.path.basename(first).startswith("python") and len(spec.command) > 1 else first
    if script.endswith(".py"):
        _check_relative(script, "the script")


def _check_word(value: str, flag: str, example: str) -> None:
    """A value written into one Dockerfile instruction: one non-empty word (a newline would start
    another instruction, a space another argument)."""
    if not value or value != value.strip() or any(c.isspace() for c in value):
        raise ShoalError(f"{flag} {value!r} is not a single word", f"give {example}")


def _check_relative(path: str, what: str) -> None:
    if os.path.isabs(path) or os.path.normpath(path).startswith(".."):
        raise ShoalError(
            f"{what} {path} lies outside the build context (this directory), so the image cannot copy it",
            "run `shoal launch image` from the directory that holds the script, and name it by a relative path",
        )


def _printf(text: str) -> str:
    """``text`` as a single-quoted printf format (newlines as ``\\n``)."""
    return shlex.quote(text.replace("\n", "\\n"))
