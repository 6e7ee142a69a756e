"""Probes between the nodes of a running job: round trips and bandwidth of every pair of nodes, an
all-reduce across every rank, and the shared-storage token. Each is bounded in time.

Every message goes through torch.distributed (gloo on CPU, NCCL on GPU), as the job's own would.
Every wait has a deadline (:class:`Clock`): ``Work.wait(timeout)`` raises when a peer does not answer
in time, and gloo then closes that pair's connection, so a probe that failed fails fast on both
sides and the pair is not used again. What a probe found is returned as plain data (JSON-ready);
:mod:`shoal.doctor.verdicts` judges it.

Bandwidth messages adapt to the link: a first 64 KiB message estimates the rate, then the message
is sized to take about :data:`TARGET_S` (within 256 KiB and ``--probe-mb``), sent three times, and
the fastest time counts (a busy machine only ever makes a link look slower). A 2.5 MB/s link is thus
measured in a fraction of a second instead of blocking the probe for the size a 10 GB/s one needs.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

PINGS = 8
"""Round trips timed per pair (after one untimed); the fastest counts, as ping's minimum: a moment
the process was not scheduled makes one round trip slow, never one fast."""
FIRST_MESSAGE = 64 << 10
MIN_MESSAGE = 256 << 10
TARGET_S = 0.05
REPEATS = 3
ALLREDUCE_ITERS = 3
TOKEN_RETRY_S = 2.0
"""How long a node retries reading the token: NFS may show a new file only after its attribute cache expires."""


class ProbeFailed(Exception):
    """A probe's peer did not answer within the deadline, or the connection to it broke."""


@dataclass
class Clock:
    """The deadline of the probe phase and the longest one wait may take."""

    deadline: float
    """``time.monotonic()`` after which nothing more is started."""
    per_op: float

    def budget(self) -> float:
        return min(self.per_op, self.deadline - time.monotonic())


def round_robin(n: int) -> list[list[tuple[int, int]]]:
    """Every pair of ``0..n-1`` exactly once, in n-1 (n even) or n (n odd) rounds of disjoint pairs
    (the circle method): each round's pairs run at the same time without sharing a node."""
    players = list(range(n)) + ([None] if n % 2 else [])  # type: ignore[list-item]
    rounds = []
    for _ in range(len(players) - 1):
        half = len(players) // 2
        pairs = [(players[i], players[-1 - i]) for i in range(half)]
        rounds.append([(min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None])
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


class PairProber:
    """Runs this node's side of each pair's probes (both sides run :meth:`run_pair` at once)."""

    def __init__(self, device: Any, max_bytes: int, clock: Clock) -> None:
        import torch

        self.device, self.clock = device, clock
        self.max_bytes = max(MIN_MESSAGE, max_bytes)
        self.buffer = torch.zeros(self.max_bytes, dtype=torch.uint8, device=device)
        self.word = torch.zeros(1, dtype=torch.float32, device=device)
        self.size = torch.zeros(1, dtype=torch.int64, device=device)

    def _wait(self, work: Any, peer_label: str) -> None:
        budget = self.clock.budget()
        if budget <= 0:
            raise ProbeFailed(f"out of time before {peer_label} answered (the probe phase's deadline passed)")
        try:
            work.wait(timedelta(seconds=budget))
        except RuntimeError as err:
            reason = "no answer" if "Timed out" in str(err) or "timeout" in str(err).lower() else "connection lost"
            raise ProbeFailed(
                f"{reason} from {peer_label} within {budget:.1f} s ({str(err).splitlines()[0][-120:]})"
            ) from None

    def send(self, tensor: Any, peer: int, label: str) -> None:
        import torch.distributed as dist

        self._wait(dist.isend(tensor, dst=peer), label)

    def recv(self, tensor: Any, peer: int, label: str) -> None:
        import torch.distributed as dist

        self._wait(dist.irecv(tensor, src=peer), label)

    def run_pair(self, me: int, peer: int, label: str) -> dict[str, Any]:
        """This rank's side of the pair's probes; what it measured: round trips (the lower rank) and
        the bandwidth of the direction it sent in."""
        found: dict[str, Any] = {"peer": peer}
        lower = me < peer
        try:
            if lower:
                found["rtt_s"] = self._ping(peer, label)
                found["sent"] = self._send_bandwidth(peer, label)
                self._receive_bandwidth(peer, label)
            else:
                self._pong(peer, label)
                self._receive_bandwidth(peer, label)
                found["sent"] = self._send_bandwidth(peer, label)
        except ProbeFailed as err:
            found["error"] = str(err)
        return found

    def _ping(self, peer: int, label: str) -> float:
        times = []
        for i in range(PINGS + 1):
            start = time.perf_counter()
            self.send(self.word, peer, label)
            self.recv(self.word, peer, label)
            if i:
                times.append(time.perf_counter() - start)
        return min(times)

    def _pong(self, peer: int, label: str) -> None:
        for _ in range(PINGS + 1):
            self.recv(self.word, peer, label)
            self.send(self.word, peer, label)

    def _send_bandwidth(self, peer: int, label: str) -> dict[str, float]:
        first = self._timed_send(FIRST_MESSAGE, peer, label)
        size = int(min(self.max_bytes, max(MIN_MESSAGE, FIRST_MESSAGE / first * TARGET_S))) // 4096 * 4096
        self.size.fill_(size)
        self.send(self.size, peer, label)
        best = min(self._timed_send(size, peer, label) for _ in range(REPEATS))
        return {"bytes": size, "seconds": best, "bytes_per_s": size / best}

    def _timed_send(self, size: int, peer: int, label: str) -> float:
        start = time.perf_counter()
        self.send(self.buffer[:size], peer, label)
        self.recv(self.word, peer, label)  # the acknowledgement: the data has arrived
        return time.perf_counter() - start

    def _receive_bandwidth(self, peer: int, label: str) -> None:
        self.recv(self.buffer[:FIRST_MESSAGE], peer, label)
        self.send(self.word, peer, label)
        self.recv(self.size, peer, label)
        size = int(self.size.item())
        if not 0 < size <= self.max_bytes:
            raise ProbeFailed(f"{label} announced a {size}-byte message (--probe-mb differs between nodes?)")
        for _ in range(REPEATS):
            self.recv(self.buffer[:size], peer, label)
            self.send(self.word, peer, label)


def allreduce_probe(nbytes: int, iters: int, *, rank: int, world: int, device: Any, clock: Clock) -> dict[str, Any]:
    """Every rank: one checked all-reduce (sum of ``rank + 1``), then ``iters`` timed ones; this rank's
    median time. Rank 0 takes the slowest rank's."""
    import torch

    from shoal.distributed.probe import CollectiveTimeout, all_reduce_within, checked_all_reduce

    numel = max(1, nbytes // 4)
    size = numel * 4
    try:
        first = checked_all_reduce(numel, rank=rank, world=world, device=device, timeout_s=_budget(clock))
        if not first.correct:
            return {"bytes": size, "correct": False, "error": f"sum {first.got}, expected {first.expected:g}"}
        tensor = torch.empty(numel, dtype=torch.float32, device=device)
        times = []
        for _ in range(iters):
            tensor.fill_(float(rank + 1))
            times.append(all_reduce_within(tensor, _budget(clock)))
    except (ProbeFailed, CollectiveTimeout) as err:
        return {"bytes": size, "correct": None, "error": str(err)}
    return {"bytes": size, "correct": True, "seconds": statistics.median(times) if times else None}


def _budget(clock: Clock) -> float:
    budget = clock.budget()
    if budget <= 0:
        raise ProbeFailed("out of time before the all-reduce")
    return budget


def write_token(directory: str, value: str) -> tuple[str, str | None]:
    """Rank 0: write ``value`` into a new file in ``directory`` (or its nearest existing parent);
    (path, None), or (path, why not)."""
    from shoal.doctor.resources import nearest_existing

    path = os.path.join(nearest_existing(os.path.abspath(directory)), f".shoal-doctor-{value}")
    try:
        with open(path, "x") as f:
            f.write(value + "\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        return path, err.strerror or str(err)
    return path, None


def read_token(path: str, value: str) -> str | None:
    """Every node: read the token back; None if it holds ``value``, else what went wrong."""
    deadline = time.monotonic() + TOKEN_RETRY_S
    while True:
        try:
            with open(path) as f:
                got = f.read().strip()
            return None if got == value else f"{path} holds another token ({got[:16]!r}): not the file rank 0 wrote"
        except FileNotFoundError:
            if time.monotonic() > deadline:
                return f"{path} does not exist on this node after {TOKEN_RETRY_S:g} s"
        except OSError as err:
            return f"cannot read {path}: {err.strerror}"
        time.sleep(0.1)
