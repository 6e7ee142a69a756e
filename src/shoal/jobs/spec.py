"""One description of a multi-node job, from which every launcher's command line is rendered.

A :class:`JobSpec` says *what* runs (the command every process runs) and *where* (hosts with slots,
or a number of Slurm nodes with processes per node), plus the rendezvous and scheduler settings.
:mod:`shoal.launch.render` turns it into an ``mpirun`` command, an sbatch script, per-node
``shoal run`` lines or SSH commands; those functions are pure, so ``--dry-run`` prints them and
golden files pin them. Facts about the machine that launches (root or not, its cores, its name)
live apart in :class:`Here`, so a spec means the same thing wherever it is rendered.

The command is one of (checked in this order):

- ``shoal ...`` (e.g. ``shoal train digits``): every process runs shoal, which detects its rank;
  a per-node launcher runs it as ``shoal run ... -m shoal train digits``;
- ``SCRIPT.py ARGS``: run with ``python``; a launcher runs ``shoal run ... SCRIPT.py ARGS``;
- ``-m MODULE ARGS``: ``python -m MODULE``; a launcher runs ``shoal run ... -m MODULE ARGS``;
- ``python[3] SCRIPT.py|-m MODULE ARGS``: the interpreter is dropped for a launcher (it uses its own);
- anything else is a program, run as is (``shoal run --no-python PROGRAM ARGS``).
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from shoal.env.base import DEFAULT_MAIN_PORT
from shoal.env.host import usable_cores
from shoal.env.network import bracket, is_local_address, is_loopback
from shoal.errors import ShoalError
from shoal.launch.k8s_spec import PodOptions, check_devices

RDZV_KINDS = ("static", "c10d")
FORWARDED_ENV = (
    "PATH",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "OMP_NUM_THREADS",
    "SHOAL_INIT_TIMEOUT",
    "SHOAL_TIMEOUT",
)
"""Variables the launching shell passes on to every process when they are set there (mpirun -x NAME):
remote processes must find the same ``shoal``/``python`` and libraries, and keep the user's settings."""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TIME = re.compile(r"(\d+-)?\d+(:\d+){0,2}|infinite|unlimited", re.I)
_HOST = re.compile(r"[A-Za-z0-9_.\-:%]+")


@dataclass(frozen=True)
class Host:
    """One machine of a host list and how many processes (slots) it runs."""

    name: str
    slots: int = 1

    def __str__(self) -> str:
        return f"{bracket(self.name)}:{self.slots}"


@dataclass(frozen=True, kw_only=True)
class Here:
    """Facts about the machine that launches the job, which some renderings depend on."""

    is_root: bool = False
    """Open MPI refuses to run as root unless told ``--allow-run-as-root``."""
    cores: int = 1
    """Usable cores here: mpirun without hosts gives this many slots."""
    hostname: str = "localhost"
    """This machine's name: a host of that name (or localhost) is started here, without SSH."""
    local_hosts: frozenset[str] = frozenset()
    """Other names of this machine among the job's hosts (its own IP addresses)."""

    @classmethod
    def detect(cls, hosts: tuple[Host, ...] = ()) -> "Here":
        """This machine; ``hosts`` that are IP addresses of it are noted in ``local_hosts``."""
        cores = usable_cores()
        local = frozenset(h.name for h in hosts if _is_own_address(h.name))
        return cls(is_root=os.geteuid() == 0, cores=cores, hostname=socket.gethostname(), local_hosts=local)

    def is_local(self, host: str) -> bool:
        """True if ``host`` names this machine (its hostname, localhost or one of its addresses)."""
        return is_loopback(host) or host in (self.hostname, self.hostname.split(".")[0]) or host in self.local_hosts


def _is_own_address(name: str) -> bool:
    """True if ``name`` is an IP address of this machine (binding a socket to it works)."""
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False  # a host name: only this machine's own name counts, see Here.is_local
    return is_local_address(name)


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """A distributed job: what every process runs, where, and how its processes find each other."""

    command: tuple[str, ...]
    """What each process runs: ``shoal train ...``, ``SCRIPT.py ARGS``, ``-m MODULE ARGS`` or a program."""
    hosts: tuple[Host, ...] = ()
    """Machines and their slots (mpirun, SSH and by-hand launches); empty: this machine only."""
    hostfile: str | None = None
    """An Open MPI hostfile passed to mpirun as is (``hosts`` then holds what it lists)."""
    np: int | None = None
    """Processes for mpirun (``-np``); default: the hosts' slots added up."""
    nodes: int = 1
    """Nodes to allocate (sbatch), or pods (Kubernetes: PyTorchJob and TrainJob pods, MPIJob workers)."""
    nproc_per_node: int | str = 1
    """Processes per node or pod (one per GPU, typically); ``auto``: one per GPU, or one on CPU."""
    gpus_per_node: int = 0
    """GPUs to allocate on every node or pod (0: none requested)."""
    cpus_per_node: int | None = None
    """CPU cores to allocate on every Slurm node; default one per process."""
    master_addr: str | None = None
    """Address of the rendezvous host; default: the first host (127.0.0.1 on this machine alone)."""
    master_port: int | None = None
    """Rendezvous port; default 29500, except in sbatch scripts: 15000 + job id % 5000 (see
    :func:`shoal.env.slurm.slurm_port`), so jobs sharing a node do not collide."""
    rdzv: str = "static"
    """Rendezvous of per-node ``shoal run`` launchers (SSH, by hand): ``static`` (node ranks given)
    or ``c10d`` (nodes join in any order). sbatch launchers always use c10d."""
    max_restarts: int = 0
    """Per-node launchers restart the whole group this many times after a worker fails."""
    env: tuple[tuple[str, str | None], ...] = ()
    """Variables every process gets: (name, value), or (name, None) to pass the launching shell's."""
    one_task_per_process: bool = False
    """sbatch: srun starts every process itself (shoal detects Slurm) instead of one launcher per node."""
    job_name: str = "shoal"
    partition: str | None = None
    time_limit: str | None = None
    """Slurm time limit (``MM``, ``HH:MM:SS``, ``D-HH:MM``, ...)."""
    output: str = "shoal-%j.out"
    """sbatch's output file (``%j``: the job id); stderr goes there too unless ``error`` is set."""
    error: str | None = None
    workdir: str | None = None
    """Directory every process starts in (sbatch ``--chdir``; SSH: ``cd``); default: Slurm's and
    mpirun's own (the submitting directory)."""
    shoal: tuple[str, ...] = ("shoal",)
    """How a launcher line invokes shoal on every node (SSH uses this Python: ``python -m shoal``)."""
    python: str = "python"
    """The interpreter that runs ``SCRIPT.py`` and ``-m MODULE`` commands under mpirun and srun."""
    rsh: str | None = None
    """Program that reaches another host (mpirun's ``plm_rsh_agent``; SSH launches); default ssh."""
    pods: PodOptions | None = None
    """Kubernetes, Run:ai and image settings (:mod:`shoal.launch.k8s_spec`); None for other launchers."""

    def __post_init__(self) -> None:
        if not self.command or not self.command[0]:
            raise ShoalError(
                "no command given", "put the command after --, e.g. `-- shoal train digits` or `-- train.py --lr 0.1`"
            )
        if self.nproc_per_node != "auto" and not (isinstance(self.nproc_per_node, int) and self.nproc_per_node >= 1):
            raise ShoalError(
                f"nproc per node must be a whole number of at least 1 or auto, got {self.nproc_per_node!r}",
                "give --nproc-per-node 1 or more, or auto",
            )
        if self.nodes < 1:
            raise ShoalError(f"nodes must be at least 1, got {self.nodes}", "give nodes of 1 or more")
        if self.gpus_per_node < 0:
            raise ShoalError(
                f"GPUs per node must be 0 or more, got {self.gpus_per_node}", "give --gpus-per-node 0 or more"
            )
        if self.cpus_per_node is not None and self.cpus_per_node < 1:
            raise ShoalError(
                f"CPUs per node must be at least 1, got {self.cpus_per_node}", "give --cpus-per-node 1 or more"
            )
        if self.np is not None and self.np < 1:
            raise ShoalError(f"-np must be at least 1, got {self.np}", "give -np 1 or more")
        if self.master_port is not None and not 0 < self.master_port < 65536:
            raise ShoalError(f"port {self.master_port} is not a TCP port", "give --master-port in 1024..65535")
        if self.rdzv not in RDZV_KINDS:
            raise ShoalError(f"unknown rendezvous {self.rdzv!r}", f"use one of: {', '.join(RDZV_KINDS)}")
        if self.max_restarts < 0:
            raise ShoalError(f"--max-restarts must be 0 or more, got {self.max_restarts}", "give 0 or more")
        if self.time_limit is not None and not _TIME.fullmatch(self.time_limit):
            raise ShoalError(
                f"--time {self.time_limit!r} is not a Slurm time limit",
                "use MINUTES, HH:MM:SS or D-HH:MM:SS, e.g. --time 1:30:00",
            )
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
        names = [h.name for h in self.hosts]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ShoalError(
                f"host listed twice: {', '.join(duplicates)}", "list each host once with all its slots, e.g. node1:4"
            )
        if len(self.hosts) > 1 and self.master_addr is None and is_loopback(self.hosts[0].name):
            raise ShoalError(
                f"the first host is {self.hosts[0].name}, which the other hosts cannot reach",
                "name the first host by an address or name the other hosts can reach, or give --master-addr",
            )
        if self.pods is not None:
            check_devices(self.command, self.gpus_per_node)
            if self.pods.elastic is not None and not self.pods.elastic[0] <= self.nodes <= self.pods.elastic[1]:
                low, high = self.pods.elastic
                raise ShoalError(
                    f"--nodes {self.nodes} is outside --elastic {low}:{high}",
                    f"give --nodes between {low} and {high} (the pods started at first)",
                )

    # ---- derived quantities the renderers share ----

    @property
    def total_slots(self) -> int:
        return sum(h.slots for h in self.hosts)

    @property
    def nproc(self) -> int:
        """Processes per node or pod, ``auto`` resolved as shoal does: one per GPU, or one on CPU."""
        if self.nproc_per_node == "auto":
            return max(1, self.gpus_per_node)
        return int(self.nproc_per_node)

    @property
    def world_size(self) -> int:
        """Processes in the job: mpirun's -np, else the slots, else nodes x processes per node."""
        if self.np is not None:
            return self.np
        if self.hosts:
            return self.total_slots
        return self.nodes * self.nproc

    def main_address(self) -> str:
        """The rendezvous host: ``master_addr``, else the first host, else 127.0.0.1."""
        if self.master_addr:
            return self.master_addr
        if self.hosts and not is_loopback(self.hosts[0].name):
            return self.hosts[0].name
        return "127.0.0.1"

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


# ---- parsing host lists and hostfiles ------------------------------------------------------


def parse_hosts(text: str, default_slots: int = 1) -> tuple[Host, ...]:
    """``"node1:2,node2:2"`` -> hosts; a host without ``:N`` gets ``default_slots``.

    IPv6 addresses go in brackets: ``[fd00::1]:2``. Raises ShoalError naming the bad item.
    """
    hint = "write --hosts as HOST:SLOTS,HOST:SLOTS, e.g. --hosts node1:2,node2:2"
    if not text.strip():
        raise ShoalError("--hosts is empty", hint)
    hosts = []
    for item in text.split(","):
        hosts.append(_parse_host(item.strip(), default_slots, f"--hosts item {item.strip()!r}", hint))
    return tuple(hosts)


def read_hostfile(path: str) -> tuple[Host, ...]:
    """The hosts of an Open MPI hostfile: ``HOST slots=N`` per line (``HOST:N`` also accepted).

    ``#`` starts a comment; ``max_slots=`` is left to mpirun. A host without a slot count is an
    error (Open MPI would guess its cores; shoal needs the number to start the right processes).
    """
    hint = "write one host per line as `node1 slots=4`"
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as err:
        raise ShoalError(f"cannot read hostfile {path}: {err.strerror}", "check the path given to --hostfile") from None
    hosts = []
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"hostfile {path} line {number}"
        slots = None
        for word in words[1:]:
            key, _, value = word.partition("=")
            if key in ("slots", "slot"):
                slots = _slots(value, where, hint)
            elif key not in ("max_slots", "max-slots"):
                raise ShoalError(f"{where}: unknown field {word!r}", hint)
        host = _parse_host(words[0], None, where, hint)
        if slots is None:
            if ":" not in words[0].rsplit("]", 1)[-1]:
                raise ShoalError(f"{where}: {words[0]} has no slots=N", hint)
            slots = host.slots
        hosts.append(Host(host.name, slots))
    if not hosts:
        raise ShoalError(f"hostfile {path} lists no host", hint)
    return tuple(hosts)


def _parse_host(item: str, default_slots: int | None, where: str, hint: str) -> Host:
    if item.startswith("["):
        name, _, rest = item[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise ShoalError(f"{where} is malformed", hint)
        count = rest[1:] if rest else None
    elif item.count(":") > 1:
        raise ShoalError(f"{where}: an IPv6 address needs brackets, e.g. [fd00::1]:2", hint)
    else:
        name, sep, count = item.partition(":")
        count = count if sep else None
    if not name or not _HOST.fullmatch(name):
        raise ShoalError(f"{where} has no valid host name", hint)
    if count is None:
        return Host(name, default_slots if default_slots is not None else 1)
    return Host(name, _slots(count, where, hint))


def _slots(value: str, where: str, hint: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise ShoalError(f"{where}: slots {value!r} is not a whole number of at least 1", hint)
    return int(value)


def looks_secret(name: str) -> bool:
    """A variable name that, by convention, holds a secret (``*_TOKEN``, ``*_KEY``, ``*PASSWORD*``,
    ``*SECRET*``): its value is never written into a launch line, script or manifest."""
    upper = name.upper()
    return upper.endswith(("_TOKEN", "_KEY")) or "PASSWORD" in upper or "SECRET" in upper


def parse_env(items: list[str] | None) -> tuple[tuple[str, str | None], ...]:
    """``--env NAME`` (pass the launching shell's value) and ``--env NAME=VALUE``."""
    out = []
    for item in items or ():
        name, sep, value = item.partition("=")
        out.append((name, value if sep else None))
    return tuple(out)


def forwarded_env(
    environ: dict[str, str] | os._Environ, extra: tuple[tuple[str, str | None], ...] = ()
) -> tuple[tuple[str, str | None], ...]:
    """:data:`FORWARDED_ENV` names that are set in ``environ``, then ``extra`` (later wins)."""
    chosen: dict[str, str | None] = {name: None for name in FORWARDED_ENV if name in environ}
    for name, value in extra:
        chosen.pop(name, None)
        chosen[name] = value
    return tuple(chosen.items())


def interpreter_first(
    env: tuple[tuple[str, str | None], ...], environ: Mapping[str, str], python: str
) -> tuple[tuple[str, str | None], ...]:
    """``env`` with PATH set to ``python``'s directory followed by this shell's PATH.

    A virtual environment's ``bin/shoal`` run without activating the environment would otherwise
    hand every process a PATH on which ``python`` and ``shoal`` are the system's (no torch there).
    A PATH given explicitly (``--env PATH=...``) is left alone.
    """
    if any(name == "PATH" and value is not None for name, value in env):
        return env
    directory = os.path.dirname(os.path.abspath(python))
    parts = [p for p in environ.get("PATH", "").split(os.pathsep) if p and p != directory]
    path = os.pathsep.join([directory, *parts])
    return (*((n, v) for n, v in env if n != "PATH"), ("PATH", path))


def shell_join(argv: list[str] | tuple[str, ...]) -> str:
    return shlex.join(argv)
