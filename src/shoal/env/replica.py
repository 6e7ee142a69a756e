"""Where this process stands in a fault-tolerant job: its replica group, read from the environment.

The launcher of replica groups (:mod:`shoal.train.ft.supervisor`: ``shoal train
--fault-tolerance``, ``shoal.fit``, ``shoal.run(fn, fault_tolerance=True)``) sets these variables
in each group's process; a group started by hand sets them itself (docs/FAULT_TOLERANCE.md).
Side-effect free, no torch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from shoal.errors import ShoalError

GROUP_ENV = "SHOAL_REPLICA_GROUP"
"""This process's replica group, 0..N-1."""
GROUPS_ENV = "SHOAL_REPLICA_GROUPS"
"""The number of replica groups of the job."""
ADDRESS_ENV = "SHOAL_REPLICA_ADDRESS"
"""The address the group's sockets bind (its store, its manager server); default 127.0.0.1."""
STORE_ENV = "SHOAL_REPLICA_STORE"
"""HOST:PORT of the group's store (default: torchrun's MASTER_ADDR and MASTER_PORT)."""
STARTS_ENV = "SHOAL_REPLICA_STARTS"
"""How many times this group has been started (1 the first time)."""
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"
"""torchft's own variable: the lighthouse's URL."""

HEARTBEAT_TIMEOUT_MS = 1000
"""A group silent this long is left out of the lighthouse's next quorum (torchft's default: 5000),
in a job of up to :data:`MANY_GROUPS` groups."""
HEARTBEAT_INTERVAL_MS = 100
"""How often each group's manager heartbeats the lighthouse (torchft's default), up to :data:`MANY_GROUPS`."""
MANY_GROUPS = 256
"""Above this many groups, each step's burst of quorum requests and answers (each answer names every
member) delays heartbeats by seconds: a 1 s timeout then counts live groups as dead (simulated with
1,000 groups against the real lighthouse: ``python -m benchmarks.lighthouse_scale``, docs/BENCHMARKS.md)."""
MANY_HEARTBEAT_TIMEOUT_MS = 10000
"""The heartbeat timeout above :data:`MANY_GROUPS` groups: 10 s held at 1,000 (5 s did not always)."""
MANY_HEARTBEAT_INTERVAL_MS = 500
"""The heartbeat interval above :data:`MANY_GROUPS` groups: a fifth of the lighthouse's heartbeat work."""
JOIN_TIMEOUT_MS = 30000
"""How long a quorum waits for a heartbeating group that has not asked to join yet (torchft's
default: 60000). Longer than a replica's collective timeout (10 s): a lighthouse that restarted
knows no quorum, and must wait for a group still stuck in the failed step's collective, or it
forms two quorums of one group each that train apart for good (seen: split brain)."""
QUORUM_TICK_MS = 20


def heartbeat_ms(groups: int | None) -> tuple[int, int]:
    """``(timeout, interval)`` of the groups' heartbeats for a job of ``groups`` replica groups (None:
    not known, taken as a job of up to :data:`MANY_GROUPS`)."""
    if groups is not None and groups > MANY_GROUPS:
        return MANY_HEARTBEAT_TIMEOUT_MS, MANY_HEARTBEAT_INTERVAL_MS
    return HEARTBEAT_TIMEOUT_MS, HEARTBEAT_INTERVAL_MS


def heartbeat_note(groups: int) -> str | None:
    """The start-up line of a job whose heartbeats differ from the default, or None."""
    if groups <= MANY_GROUPS:
        return None
    timeout, interval = heartbeat_ms(groups)
    return (
        f"shoal: {groups} replica groups: the lighthouse leaves a group out after {timeout / 1000:g} s without a "
        f"heartbeat (1 s up to {MANY_GROUPS} groups), each group heartbeats every {interval} ms: a dead group costs "
        f"the others about {timeout / 1000:g} s (docs/FAULT_TOLERANCE.md, 'What holds at which size')"
    )


def lighthouse_args(bind: str, min_replicas: int = 1, groups: int | None = None) -> list[str]:
    """torchft's lighthouse flags with shoal's settings, the same for the lighthouse shoal runs
    itself (:mod:`shoal.train.ft.lighthouse`) and the one it renders for Kubernetes
    (:mod:`shoal.jobs.kubernetes.fault_tolerance`). ``bind``: HOST:PORT, never torchft's ``[::]``;
    ``groups``: the job's replica groups, which set the heartbeat timeout (:func:`heartbeat_ms`)."""
    timeout, _ = heartbeat_ms(groups)
    return [
        "--bind", bind, "--min_replicas", str(min_replicas), "--heartbeat_timeout_ms", str(timeout),
        "--join_timeout_ms", str(JOIN_TIMEOUT_MS), "--quorum_tick_ms", str(QUORUM_TICK_MS),
    ]  # fmt: skip


@dataclass(frozen=True)
class ReplicaCoordinates:
    """This process's replica group, the job's number of groups, and where the group meets."""

    group: int
    groups: int
    address: str
    store: tuple[str, int]
    lighthouse: str
    starts: int = 1


def replica_coordinates(environ: Mapping[str, str] | None = None) -> ReplicaCoordinates:
    """The coordinates the launcher set, or one line and a HINT naming what is missing."""
    env = os.environ if environ is None else environ
    missing = [name for name in (GROUP_ENV, GROUPS_ENV, LIGHTHOUSE_ENV) if not env.get(name)]
    store = env.get(STORE_ENV) or (
        f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}" if env.get("MASTER_ADDR") and env.get("MASTER_PORT") else ""
    )
    if not store:
        missing.append(STORE_ENV)
    if missing:
        raise ShoalError(
            f"this process was not started as a replica group: {', '.join(missing)} not set",
            "start replica groups with shoal train --fault-tolerance, shoal.run(fn, nproc=2, fault_tolerance=True), "
            "or set them by hand (docs/FAULT_TOLERANCE.md)",
        )
    host, _, port = store.rpartition(":")
    try:
        group, groups, port_number = int(env[GROUP_ENV]), int(env[GROUPS_ENV]), int(port)
    except ValueError:
        raise ShoalError(
            f"{GROUP_ENV}, {GROUPS_ENV} and the store's port must be integers", "set them as the launcher does"
        ) from None
    if not 0 <= group < groups:
        raise ShoalError(f"{GROUP_ENV}={group} is not in 0..{groups - 1}", f"set it below {GROUPS_ENV}={groups}")
    return ReplicaCoordinates(
        group=group,
        groups=groups,
        address=env.get(ADDRESS_ENV, "127.0.0.1"),
        store=(host.strip("[]"), port_number),
        lighthouse=env[LIGHTHOUSE_ENV],
        starts=int(env.get(STARTS_ENV, "1")),
    )


_first_quorum_gate: Callable[[], None] | None = None


def set_first_quorum_gate(gate: Callable[[], None] | None) -> None:
    """What a group waits on before its first quorum (the launcher sets it in each group's process:
    every group of the job's first start is then heartbeating, and the first quorum holds them all)."""
    global _first_quorum_gate
    _first_quorum_gate = gate


def before_first_quorum() -> bool:
    """Whether this process still has the launcher's gate to pass: the job's first start of its
    group, before its first quorum (its training has not begun)."""
    return _first_quorum_gate is not None


def pass_first_quorum_gate() -> None:
    """Wait at the launcher's gate, once per process (a no-op without one, or after the first call)."""
    global _first_quorum_gate
    gate, _first_quorum_gate = _first_quorum_gate, None
    if gate is not None:
        gate()
