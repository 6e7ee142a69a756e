"""The shape of a distributed job, checked in one place for every launcher: processes per node, the
port, restarts, the rendezvous and how workers start.

Torch-free, below both launchers: :class:`shoal.launch.options.LaunchOptions` (``shoal run``,
``shoal train --nproc``, ``shoal.fit``, ``shoal.run``) and :class:`shoal.jobs.spec.JobSpec`
(``shoal launch``) check their fields here, each naming its own flag, so that the same value is
refused with the same words whichever command got it.
"""

from __future__ import annotations

from shoal.errors import ShoalError, check_choice

RDZV_BACKENDS = ("static", "c10d")
"""Rendezvous of per-node launchers: ``static`` (node ranks given) or ``c10d`` (nodes join in any order)."""
START_METHODS = ("auto", "fork", "spawn")
"""How a launcher starts this node's workers; ``auto``: fork on CPU, spawn with CUDA."""


def check_nproc(nproc: object, flag: str = "--nproc", *, auto: bool = False) -> None:
    """``nproc`` worker processes per node: a whole number of at least 1 (or ``auto`` where allowed)."""
    if auto and nproc == "auto":
        return
    if isinstance(nproc, int) and not isinstance(nproc, bool) and nproc >= 1:
        return
    also = ", or auto" if auto else ""
    raise ShoalError(
        f"{flag} must be at least 1{' or auto' if auto else ''}, got {nproc!r}",
        f"pass {flag} 1 or more (worker processes per node, one per GPU typically){also}",
    )


def check_port(port: int | None, flag: str = "--master-port") -> None:
    """A TCP port, or None for the default."""
    if port is not None and not 0 < port < 65536:
        raise ShoalError(f"{flag} {port} is not a TCP port", f"give {flag} in 1024..65535")


def check_max_restarts(restarts: int) -> None:
    if restarts < 0:
        raise ShoalError(f"--max-restarts must be 0 or more, got {restarts}", "pass --max-restarts 0 or more")


def check_rdzv_backend(name: str) -> None:
    check_choice("rendezvous", name, RDZV_BACKENDS)


def check_start_method(name: str) -> str:
    return check_choice("start method", name, START_METHODS)
