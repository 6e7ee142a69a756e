"""How a launcher starts this node's workers and how the nodes find each other: :class:`LaunchOptions`.

One frozen dataclass for every launcher (``shoal run``, ``shoal train --nproc``, ``shoal demo``,
``shoal.fit``), checked once in ``__post_init__``; ``shoal train``'s flags are generated from its
fields (``shoal.cli.fields``). The training configuration knows nothing of it: how many processes
run a job is not part of what the job computes.

The small parsers torchrun's flags need (``--nnodes MIN:MAX``, ``--rdzv-conf k=v,...``, the
``is_host`` boolean) live here too, so that ``shoal run`` (torch's parser) and ``shoal train``
(ours) accept and refuse exactly the same things.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from shoal.env.operator import operator_defaults
from shoal.errors import ShoalError
from shoal.launch.watchdog import hang_options
from shoal.shape import check_max_restarts, check_nproc, check_port, check_rdzv_backend, check_start_method

DEFAULT_JOIN_TIMEOUT_S = 60.0
"""Every node gives up this long after it started if the job has not assembled."""
DEFAULT_RUN_ID = "shoal"
"""The job id of a rendezvous (torchrun's default is "none"); the same on every node."""

_TRUE = ("1", "true", "t", "yes", "y", "on")
_FALSE = ("0", "false", "f", "no", "n", "off")


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """Workers on this node and the rendezvous that joins the nodes. Defaults: one process, here."""

    nproc: int = field(default=1, metadata={"aliases": ("--nproc-per-node",), "min": 1})
    """Worker processes to start on this node (one per GPU, typically)."""
    nnodes: str = field(
        default="1", metadata={"metavar": "N|MIN:MAX", "aliases": ("--nodes",), "check": lambda text: _nnodes(text)}
    )
    """Number of nodes: N, or MIN:MAX for an elastic job (with --rdzv-backend c10d)."""
    node_rank: int = 0
    """This node's rank, 0..N-1 (static rendezvous; node 0 hosts the store)."""
    master_addr: str | None = field(default=None, metadata={"metavar": "ADDR"})
    """Address of node rank 0, where the rendezvous store listens (static)."""
    master_port: int | None = field(default=None, metadata={"metavar": "PORT"})
    """Port of the store on the master (static; default 29500)."""
    rdzv_backend: Literal["static", "c10d"] = "static"
    """Rendezvous: static (fixed node ranks) or c10d (nodes join in any order; elastic)."""
    rdzv_endpoint: str | None = field(default=None, metadata={"metavar": "HOST[:PORT]"})
    """c10d store address HOST[:PORT] (default port 29400); the node that owns HOST hosts it."""
    rdzv_id: str = field(default=DEFAULT_RUN_ID, metadata={"metavar": "ID"})
    """Job id, the same on every node."""
    join_timeout: float = field(default=DEFAULT_JOIN_TIMEOUT_S, metadata={"metavar": "S"})
    """Fail when the nodes have not all arrived after this many seconds."""
    max_restarts: int = 0
    """Restart the workers of every node up to this many times after a failure (they resume)."""
    start_method: Literal["auto", "fork", "spawn"] = "auto"
    """How local workers start: fork (they inherit this process's imports: seconds sooner) or spawn
    (fresh interpreters); auto: fork on CPU, spawn with CUDA (CUDA does not survive a fork)."""
    verbose: bool = False
    """Show torch's elastic agent logs too (default: shoal's own lines only)."""
    local_addr: str | None = field(default=None, metadata={"metavar": "ADDR"})
    """This node's address as the other nodes reach it (default: found from the route to the master)."""
    rdzv_conf: tuple[tuple[str, str], ...] = ()
    """Extra rendezvous settings (torchrun's --rdzv-conf k=v,...); yours win over shoal's."""
    hang_timeout: float | None = field(default=None, metadata={"metavar": "S"})
    """Report a hang when no rank makes progress for this many seconds (default: 10 x the observed
    step time, at least 30 s; docs/WATCHDOG.md)."""
    on_hang: Literal["report", "stop", "restart"] = "report"
    """After a hang report: report only, stop the workers (exit non-zero), or restart them from the
    last checkpoint (counts against --max-restarts)."""
    in_pod: bool = field(default=False, metadata={"flag": False})
    """The options came from a Kubernetes operator's variables (:meth:`from_environment`): this is a
    pod's command, which starts the pod's workers whatever the environment says. Not a flag."""

    @classmethod
    def from_environment(
        cls,
        given: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
        *,
        pod: Mapping[str, Any] | None = None,
    ) -> LaunchOptions:
        """The one constructor launchers use: the operator's variables in a pod give the defaults
        (:func:`shoal.env.operator.operator_defaults`), ``given`` (the user's flags or keyword
        arguments) wins over them. Outside a pod, ``given`` alone. ``pod``: those defaults, where
        the caller has read them from ``environ`` already (``shoal env`` reports them)."""
        if pod is None:
            pod = operator_defaults(os.environ if environ is None else environ)
        return cls(**{**pod, **(given or {}), "in_pod": bool(pod)})

    def __post_init__(self) -> None:
        check_nproc(self.nproc)
        min_nodes, max_nodes = self.node_counts
        if self.node_rank < 0 or (self.several_nodes and self.rdzv_backend == "static" and self.node_rank >= max_nodes):
            raise ShoalError(
                f"--node-rank {self.node_rank} is not in 0..{max_nodes - 1} (--nnodes {self.nnodes})",
                "give each node its own rank from 0 to N-1; node 0 hosts the rendezvous",
            )
        check_rdzv_backend(self.rdzv_backend)
        if self.rdzv_backend == "static" and min_nodes != max_nodes:
            raise ShoalError(
                f"--nnodes {self.nnodes} is elastic, which the static rendezvous cannot do",
                "use --rdzv-backend c10d --rdzv-endpoint HOST:PORT for MIN:MAX, or give one node count",
            )
        check_join_timeout(self.join_timeout)
        check_max_restarts(self.max_restarts)
        check_port(self.master_port)
        hang_options(self.hang_timeout, self.on_hang)
        check_start_method(self.start_method)

    @functools.cached_property
    def node_counts(self) -> tuple[int, int]:
        """(MIN, MAX) nodes from ``nnodes``."""
        return parse_nnodes(self.nnodes)

    @property
    def several_nodes(self) -> bool:
        """True when this node is one of several (the job may span more than one node)."""
        return self.node_counts[1] > 1

    @property
    def conf(self) -> dict[str, str]:
        return dict(self.rdzv_conf)

    @property
    def asks_for_workers(self) -> bool:
        """The options ask for worker processes on this node (more than one, or several nodes); whether
        they start is :func:`shoal.launch.local.placement`'s decision."""
        return self.nproc > 1 or self.several_nodes


def parse_nnodes(text: str) -> tuple[int, int]:
    """``"2"`` -> (2, 2); ``"1:4"`` -> (1, 4); ShoalError for anything else."""
    hint = "give --nnodes N or --nnodes MIN:MAX with 1 <= MIN <= MAX"
    try:
        parts = [int(p) for p in str(text).split(":")]
    except ValueError:
        raise ShoalError(f"--nnodes {text} is not N or MIN:MAX", hint) from None
    if len(parts) == 1:
        parts *= 2
    if len(parts) != 2 or not 0 < parts[0] <= parts[1]:
        raise ShoalError(f"--nnodes {text} is not a valid node count", hint)
    return parts[0], parts[1]


def _nnodes(text: str) -> None:
    """``--nnodes`` as typed: ValueError (what is wrong, without the flag) unless N or MIN:MAX."""
    try:
        parse_nnodes(text)
    except ShoalError:
        raise ValueError("is not N or MIN:MAX (1 <= MIN <= MAX)") from None


def check_join_timeout(seconds: float) -> float:
    if not seconds > 0:
        raise ShoalError(f"--join-timeout must be positive, got {seconds:g}", "pass seconds, e.g. --join-timeout 60")
    return seconds


def parse_conf(text: str | None) -> tuple[tuple[str, str], ...]:
    """torchrun's ``--rdzv-conf k1=v1,k2=v2`` as ``(("k1", "v1"), ("k2", "v2"))``."""
    conf: dict[str, str] = {}
    for item in (text or "").split(","):
        if item.strip():
            key, sep, value = item.partition("=")
            if not sep:
                raise ShoalError(
                    f"--rdzv-conf item {item!r} is not KEY=VALUE", "write it as --rdzv-conf key1=value1,key2=value2"
                )
            conf[key.strip()] = value.strip()
    return tuple(conf.items())


def parse_bool(name: str, text: str) -> bool:
    """A boolean rendezvous setting as torch reads one (``is_host=1``, ``yes``, ``false``...)."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ShoalError(f"--rdzv-conf {name}={text!r} is not a boolean", f"write {name}=1 or {name}=0")


def parse_endpoint(text: str, default_port: int) -> tuple[str, int]:
    """``HOST[:PORT]`` (IPv6 in brackets: ``[fd00::1]:29400``) -> (host, port); ShoalError if malformed."""
    hint = "write it as HOST:PORT, e.g. 10.0.0.1:29400 (IPv6: [fd00::1]:29400)"
    text = text.strip()
    if text.startswith("["):
        host, closed, rest = text[1:].partition("]")
        if not closed:
            raise ShoalError(f"bad rendezvous endpoint {text!r}: no closing bracket", hint)
        port_text = rest[1:] if rest.startswith(":") else ("" if not rest else None)
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:  # a name, an IPv4 address, or a bare IPv6 address
        host, port_text = text, ""
    if not host or port_text is None:
        raise ShoalError(f"bad rendezvous endpoint {text!r}", hint)
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 <= int(port_text) < 65536:
        raise ShoalError(f"bad rendezvous endpoint {text!r}: port {port_text!r} is not a TCP port", hint)
    return host, int(port_text)


def oversubscribed(nproc: int, cores: int) -> tuple[str, str] | None:
    """``(what, hint)`` when ``nproc`` worker processes exceed this node's ``cores`` usable cores
    (:func:`shoal.env.host.usable_cores`), else None. They then take turns on the cores, and each
    collective waits for whichever rank is descheduled: a job slower than one with fewer workers.
    Said by the launchers as a warning, and by ``shoal doctor --nproc N`` as a check."""
    if nproc <= cores:
        return None
    plural = "s" if cores != 1 else ""
    return (
        f"{nproc} worker processes on {cores} usable core{plural}: they take turns, and every collective "
        "waits for the one that is not running",
        f"use --nproc {cores} or fewer on this machine (more processes than cores only slow the job down)",
    )
