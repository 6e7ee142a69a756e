"""The hosts target's options: a list of hosts with slots, mpirun's -np, the program that reaches a host.

A job on a host list is started from one machine (the head node): by Open MPI's ``mpirun``, by one
``shoal run`` per host over SSH, or by hand (:mod:`shoal.jobs.hosts.render`). What only this
target needs rides beside the generic :class:`~shoal.jobs.spec.JobSpec` in :class:`HostsOptions`;
facts about the machine that launches (root or not, its cores, its names) live in :class:`Here`, so
a spec means the same thing wherever it is rendered.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from shoal.env.host import usable_cores
from shoal.env.network import bracket, is_local_address, is_loopback
from shoal.errors import ShoalError
from shoal.jobs.spec import JobSpec

FORWARDED_ENV = (
    "PATH",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "OMP_NUM_THREADS",
    "SHOAL_INIT_TIMEOUT",
    "SHOAL_TIMEOUT",
    "SHOAL_TF_CONFIG",
)
"""Variables the launching shell passes on to every process when they are set there (mpirun -x NAME):
remote processes must find the same ``shoal``/``python`` and libraries, and keep the user's settings."""

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
class HostsOptions:
    """Where a host-list job runs and how it is reached: the options of mpirun, SSH and by-hand launches."""

    hosts: tuple[Host, ...] = ()
    """Machines and their slots (one node per host); empty: this machine only (mpirun ``-np``)."""
    hostfile: str | None = None
    """An Open MPI hostfile passed to mpirun as is (``hosts`` then holds what it lists)."""
    np: int | None = None
    """Processes for mpirun (``-np``); default: the hosts' slots added up."""
    rsh: str | None = None
    """Program that reaches another host (mpirun's ``plm_rsh_agent``; SSH launches); default ssh."""

    def __post_init__(self) -> None:
        if self.np is not None and self.np < 1:
            raise ShoalError(f"-np must be at least 1, got {self.np}", "give -np 1 or more")
        names = [h.name for h in self.hosts]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ShoalError(
                f"host listed twice: {', '.join(duplicates)}", "list each host once with all its slots, e.g. node1:4"
            )

    @property
    def total_slots(self) -> int:
        return sum(h.slots for h in self.hosts)

    def world_size(self) -> int:
        """Processes in the job: mpirun's -np, else the hosts' slots (0: no host given)."""
        return self.np if self.np is not None else self.total_slots

    def main_address(self, spec: JobSpec) -> str:
        """The rendezvous host: ``spec.master_addr``, else the first host, else 127.0.0.1.

        Several hosts whose first is a loopback name and no ``master_addr``: the others could not
        reach it, a ShoalError.
        """
        if spec.master_addr:
            return spec.master_addr
        if len(self.hosts) > 1 and is_loopback(self.hosts[0].name):
            raise ShoalError(
                f"the first host is {self.hosts[0].name}, which the other hosts cannot reach",
                "name the first host by an address or name the other hosts can reach, or give --master-addr",
            )
        if self.hosts and not is_loopback(self.hosts[0].name):
            return self.hosts[0].name
        return "127.0.0.1"


# ---- parsing host lists and hostfiles -------------------------------------------------------


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
