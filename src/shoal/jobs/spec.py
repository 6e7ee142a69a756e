"""A job as every target sees it: what each process runs, on how many nodes, how they meet.

:class:`JobSpec` is the generic half of a job (TorchX's AppDef): the command, the nodes and the
processes on each, the rendezvous, the variables, the job's name and directory. What one target alone
needs lives beside its renderer, as that target's options (TorchX's runopts):
:class:`~shoal.jobs.hosts.options.HostsOptions` (a host list, mpirun's -np, the rsh agent),
:class:`~shoal.jobs.slurm.SlurmOptions` (partition, time limit, output files...) and
:class:`~shoal.jobs.kubernetes.options.PodOptions` (image, resources, volumes, secrets, grace). A
renderer takes ``(spec, options)`` and is pure, so ``--dry-run`` prints it and golden files pin it.

The command is one of (checked in this order):

- ``shoal ...`` (e.g. ``shoal train digits``): every process runs shoal, which detects its rank;
  a per-node launcher runs it as ``shoal run ... -m shoal train digits``;
- ``SCRIPT.py ARGS``: run with ``python``; a launcher runs ``shoal run ... SCRIPT.py ARGS``;
- ``-m MODULE ARGS``: ``python -m MODULE``; a launcher runs ``shoal run ... -m MODULE ARGS``;
- ``python[3] SCRIPT.py|-m MODULE ARGS``: the interpreter is dropped for a launcher (it uses its own);
- anything else is a program, run as is (``shoal run --no-python PROGRAM ARGS``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from shoal.env.base import DEFAULT_MAIN_PORT
from shoal.errors import ShoalError
from shoal.shape import check_max_restarts, check_nproc, check_port, check_rdzv_backend

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """A distributed job: what every process runs, on how many nodes, and how its processes meet.

    The field names are :class:`~shoal.launch.options.LaunchOptions`' where both hold the same thing
    (``nproc``, ``rdzv_backend``, ``max_restarts``, ``master_addr``, ``master_port``).
    """

    command: tuple[str, ...]
    """What each process runs: ``shoal train ...``, ``SCRIPT.py ARGS``, ``-m MODULE ARGS`` or a program."""
    nodes: int = 1
    """Nodes to allocate (sbatch), or pods (Kubernetes: PyTorchJob and TrainJob pods, MPIJob workers).
    A host list (:class:`~shoal.jobs.hosts.options.HostsOptions`) has one node per host instead."""
    nproc: int | str = 1
    """Processes per node or pod (one per GPU, typically); ``auto``: one per GPU, or one on CPU
    (see :attr:`local_world_size`). A host list gives each host's slots instead."""
    gpus_per_node: int = 0
    """GPUs to allocate on every node or pod (0: none requested)."""
    master_addr: str | None = None
    """Address of the rendezvous host; default: the first host (127.0.0.1 on this machine alone)."""
    master_port: int | None = None
    """Rendezvous port; default 29500, except in sbatch scripts: 15000 + job id % 5000 (see
    :func:`shoal.env.slurm.slurm_port`), so jobs sharing a node do not collide."""
    rdzv_backend: str = "static"
    """Rendezvous of per-node ``shoal run`` launchers (SSH, by hand): ``static`` (node ranks given)
    or ``c10d`` (nodes join in any order). sbatch launchers always use c10d."""
    max_restarts: int = 0
    """Per-node launchers restart the whole group this many times after a worker fails."""
    env: tuple[tuple[str, str | None], ...] = ()
    """Variables every process gets: (name, value), or (name, None) to pass the launching shell's."""
    job_name: str = "shoal"
    """The job's name: sbatch's ``--job-name``, the Kubernetes object's name, the c10d run id."""
    workdir: str | None = None
    """Directory every process starts in (sbatch ``--chdir``; SSH: ``cd``); default: Slurm's and
    mpirun's own (the submitting directory)."""
    shoal: tuple[str, ...] = ("shoal",)
    """How a launcher line invokes shoal on every node (SSH uses this Python: ``python -m shoal``)."""
    python: str = "python"
    """The interpreter that runs ``SCRIPT.py`` and ``-m MODULE`` commands under mpirun and srun."""

    def __post_init__(self) -> None:
        if not self.command or not self.command[0]:
            raise ShoalError(
                "no command given", "put the command after --, e.g. `-- shoal train digits` or `-- train.py --lr 0.1`"
            )
        check_nproc(self.nproc, "--nproc", auto=True)
        if self.nodes < 1:
            raise ShoalError(f"nodes must be at least 1, got {self.nodes}", "give nodes of 1 or more")
        if self.gpus_per_node < 0:
            raise ShoalError(
                f"GPUs per node must be 0 or more, got {self.gpus_per_node}", "give --gpus-per-node 0 or more"
            )
        check_port(self.master_port)
        check_rdzv_backend(self.rdzv_backend)
        check_max_restarts(self.max_restarts)
        for name, value in self.env:
            if not _ENV_NAME.fullmatch(name):
                raise ShoalError(f"--env {name!r} is not a variable name", "use --env NAME or --env NAME=VALUE")
            if value is not None and looks_secret(name):
                raise ShoalError(
                    f"--env {name}=... looks like a secret given in clear: it would be written into the "
                    "launch line, script or manifest",
                    f"set {name} in the environment of every node (a file the job sources, your secrets "
                    f"manager); --env {name} alone passes this shell's value by name (mpirun, Slurm); "
                    f"Kubernetes: --secret-env {name}=SECRET:KEY",
                )

    # ---- derived quantities the renderers share ----

    @property
    def local_world_size(self) -> int:
        """Processes per node or pod, ``auto`` resolved as shoal does: one per GPU, or one on CPU."""
        if self.nproc == "auto":
            return max(1, self.gpus_per_node)
        return int(self.nproc)

    def port(self) -> int:
        return DEFAULT_MAIN_PORT if self.master_port is None else self.master_port

    def process_argv(self) -> list[str]:
        """What one process runs when a launcher (mpirun, srun) starts every process itself."""
        first = self.command[0]
        if first.endswith(".py") or first == "-m":
            return [self.python, *self.command]
        return list(self.command)

    def launcher_target(self) -> list[str]:
        """What follows ``shoal run``'s own flags when a per-node launcher starts the processes."""
        first, rest = self.command[0], list(self.command[1:])
        if os.path.basename(first) == "shoal":
            return ["-m", "shoal", *rest]
        if first.endswith(".py") or first == "-m":
            return list(self.command)
        if _is_python(first) and rest and (rest[0].endswith(".py") or rest[0] == "-m"):
            return rest
        return ["--no-python", *self.command]


def _is_python(program: str) -> bool:
    return re.fullmatch(r"python[\d.]*", os.path.basename(program)) is not None


def looks_secret(name: str) -> bool:
    """A variable name that, by convention, holds a secret (``*_TOKEN``, ``*_KEY``, ``*PASSWORD*``,
    ``*SECRET*``): its value is never written into a launch line, script or manifest."""
    upper = name.upper()
    return upper.endswith(("_TOKEN", "_KEY")) or "PASSWORD" in upper or "SECRET" in upper


def shoal_train_args(command: Sequence[str]) -> list[str] | None:
    """The arguments after ``train`` when ``command`` is ``shoal train ...`` (or ``[python] -m shoal
    train ...``), else None."""
    words = list(command)
    if "-m" in words[:2] and (words[0] == "-m" or os.path.basename(words[0]).startswith("python")):
        words = words[words.index("-m") + 1 :]
    if len(words) < 2 or os.path.basename(words[0]) != "shoal" or words[1] != "train":
        return None
    return words[2:]


def fault_tolerant(command: Sequence[str]) -> bool:
    """True when ``command`` is ``shoal train ... --fault-tolerance`` (replica groups, torchft)."""
    args = shoal_train_args(command)
    return args is not None and "--fault-tolerance" in args


def train_option(command: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` (``--device``, ``--out``) in a ``shoal train`` command, or None."""
    value = None
    words = shoal_train_args(command) or []
    for i, word in enumerate(words):
        if word == flag and i + 1 < len(words):
            value = words[i + 1]
        elif word.startswith(flag + "="):
            value = word.split("=", 1)[1]
    return value


def parse_env(items: list[str] | None) -> tuple[tuple[str, str | None], ...]:
    """``--env NAME`` (pass the launching shell's value) and ``--env NAME=VALUE``."""
    out = []
    for item in items or ():
        name, sep, value = item.partition("=")
        out.append((name, value if sep else None))
    return tuple(out)


def parse_nproc(text: str | int | None) -> int | str:
    """``--nproc N`` or ``auto`` (one process per GPU, or one per pod on CPU)."""
    if text is None or text == "auto":
        return "auto"
    if isinstance(text, int) or text.isdigit():
        value = int(text)
        if value >= 1:
            return value
    raise ShoalError(
        f"--nproc {text!r} is neither a whole number of at least 1 nor auto",
        "give --nproc 4, or auto (one process per GPU, one per pod on CPU)",
    )
