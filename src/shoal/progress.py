"""The workers' progress channel: one small memory-mapped file per rank, written with plain stores.

A worker says what it is doing (its step and phase: data, forward, backward, collective, optimizer,
checkpoint, evaluation) by writing a fixed-size record into ``$SHOAL_PROGRESS_DIR/rank-N.progress``;
anyone on the node (the launcher's watchdog, ``shoal status`` from another terminal) reads it. No
store write, no collective, no system call per update: a :meth:`ProgressWriter.phase` call is a
couple of ``struct.pack_into`` into a shared page (about a microsecond, see docs/WATCHDOG.md).

Torn reads: each region of the record is framed by one sequence number at both ends, the writer
storing head first and tail last; a reader takes the tails before its copy and the heads after it,
and keeps the copy only if they all agree (a seqlock without a second store).

Stacks on demand: :meth:`ProgressWriter.open` also registers :mod:`faulthandler` on
:data:`STACKS_SIGNAL` with the per-rank file ``rank-N.stacks``. faulthandler's handler runs in C, so
it dumps every thread's Python stack even while the main thread is blocked inside a gloo collective
(where Python signal handlers do not run). The record says whether the handler is installed
(``stacks_signal``): the default action of that signal is to terminate, so nobody sends it to a rank
that did not register it.

This module sits in the lowest layer (no torch, nothing of shoal but errors): the workers' side
(context, train) and the launcher's side (launch) both import it.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import json
import mmap
import os
import signal
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

ENV_DIR = "SHOAL_PROGRESS_DIR"
"""The directory the launcher names for the progress files (:func:`run_progress_dir`)."""


def run_progress_dir(run_dir: str | os.PathLike) -> Path:
    """``RUN_DIR/progress``: where a run's ranks (or replica groups) keep their records."""
    return Path(run_dir) / "progress"


STACKS_SIGNAL = signal.SIGUSR2
"""Dumps every thread's stack into ``rank-N.stacks``. Not used by torch's agent nor by shoal
(:mod:`shoal.preemption` takes SIGTERM and SIGUSR1)."""

PHASES = ("start", "data", "forward", "backward", "collective", "optimizer", "checkpoint", "evaluation", "done")
"""Phase names; the record stores the index. ``start``: before the first step (rendezvous, loading);
``done``: the writer was closed (the worker finished)."""
_PHASE_CODE = {name: code for code, name in enumerate(PHASES)}

_MAGIC = b"SHP1"
# Header, written once: magic, version, pid, rank, local rank, world size, stacks signal, start time
# (wall, monotonic), host name.
_HEAD = struct.Struct("<4sHxxqqqqidd64s")
# Two live regions, each written by one pack_into and framed by the same sequence number at both
# ends (a seqlock): the writer's stores land in order (struct packs field by field; x86 keeps stores
# in order), the reader takes the tail before the body and the head after it.
# Phase: step, phase, collective count, time of the phase change (monotonic).
_PHASE = struct.Struct("<QqiqdQ")
# Step: last step's duration, compute, wait, samples; totals: timed steps, samples, compute, wait.
_STEP = struct.Struct("<QdddqqqddQ")
_PHASE_AT = 128
_STEP_AT = _PHASE_AT + _PHASE.size
SIZE = 256
assert _HEAD.size <= _PHASE_AT and _STEP_AT + _STEP.size <= SIZE


def progress_path(directory: str | os.PathLike, rank: int) -> Path:
    return Path(directory) / f"rank-{rank}.progress"


def stacks_path(directory: str | os.PathLike, rank: int) -> Path:
    return Path(directory) / f"rank-{rank}.stacks"


@dataclass(frozen=True)
class RankProgress:
    """One rank's record as read at one moment. Times ``*_mono`` are the node's monotonic clock
    (comparable between processes of one node), ``*_wall`` the epoch."""

    rank: int
    pid: int
    local_rank: int
    world_size: int
    host: str
    started_wall: float
    stacks_signal: int
    seq: int
    step: int
    phase: str
    collectives: int
    phase_since_mono: float
    phase_since_wall: float
    step_s: float
    compute_s: float
    wait_s: float
    samples: int
    steps_timed: int
    total_samples: int
    total_compute_s: float
    total_wait_s: float
    path: str = ""
    remote: bool = False
    """Read from another node's summary (:func:`from_summary`): its pid and clock are that node's."""
    where: str = ""
    """Where the rank's main thread is (``train.py:88 in load_batch``), once its launcher dumped its
    stack on a hang and shared it; "" otherwise (never read from the record itself)."""

    @property
    def alive(self) -> bool:
        """Whether the writing process still exists (on this node; True for a remote record: its own
        launcher watches it)."""
        if self.remote:
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.step_s if self.step_s > 0 else 0.0

    @property
    def stacks_file(self) -> Path:
        return stacks_path(Path(self.path).parent, self.rank)


class ProgressWriter:
    """The worker's side. Use :meth:`from_env`; every method is a no-op when there is no channel.

    Not thread-safe: one thread (the training loop) writes.
    """

    def __init__(
        self, directory: str | os.PathLike | None, rank: int = 0, *, stacks: bool = True, create: bool = True
    ) -> None:
        """``create=False``: the directory must exist already (the launcher's channel); when it is gone,
        the writer is a no-op instead of making it again."""
        self.enabled = directory is not None
        self._step = 0
        self._phase = 0
        self._collectives = 0
        self._pseq = 0
        self._sseq = 0
        self._totals = [0, 0, 0.0, 0.0]
        self._stacks_file: IO[bytes] | None = None
        self._map: mmap.mmap | None = None
        if directory is None:
            return
        directory = Path(directory)
        if create:
            directory.mkdir(parents=True, exist_ok=True)
        try:
            self._open(directory, rank, stacks)
        except FileNotFoundError:
            if create:
                raise
            self.enabled = False  # the launcher is done and removed its run directory
            self._release()

    def _open(self, directory: Path, rank: int, stacks: bool) -> None:
        self.path = progress_path(directory, rank)
        # A new file renamed over the old one (a restarted worker's): a reader that has the old one
        # mapped keeps reading it, where truncating it in place would give that reader a SIGBUS.
        temporary = self.path.with_name(f"{self.path.name}.tmp-{os.getpid()}")
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, SIZE)
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        signum = self._register_stacks(directory, rank) if stacks else 0
        host = os.environ.get("SHOAL_NODE_NAME") or socket.gethostname()
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        world_size = int(os.environ.get("WORLD_SIZE", 1))
        _HEAD.pack_into(
            self._map, 0, _MAGIC, 1, os.getpid(), rank, local_rank, world_size, signum, time.time(), time.monotonic(),
            host.encode()[:64],
        )  # fmt: skip
        self._write_step(0.0, 0.0, 0.0, 0)
        self._write_phase()
        os.replace(temporary, self.path)

    @classmethod
    def from_env(cls, rank: int | None = None, *, stacks: bool = True) -> ProgressWriter:
        """The writer for this worker: ``$SHOAL_PROGRESS_DIR`` and ``$RANK``; a no-op writer when the
        launcher named no directory, or when that directory is gone (the launcher made it before
        starting the workers and removes it when it ends: a worker still starting then must not leave
        a new run directory behind in the temporary directory)."""
        directory = os.environ.get(ENV_DIR) or None
        if rank is None:
            rank = int(os.environ.get("RANK", 0))
        return cls(directory, rank, stacks=stacks, create=False)

    def _register_stacks(self, directory: Path, rank: int) -> int:
        # Leave a handler the program installed itself alone (it is theirs); then no stacks on demand.
        if signal.getsignal(STACKS_SIGNAL) not in (signal.SIG_DFL, None):
            return 0
        self._stacks_file = open(stacks_path(directory, rank), "ab", buffering=0)  # noqa: SIM115 - lives with the writer
        faulthandler.register(STACKS_SIGNAL, file=self._stacks_file, all_threads=True, chain=False)
        return int(STACKS_SIGNAL)

    def _write_phase(self) -> None:
        self._pseq += 1
        seq = self._pseq
        _PHASE.pack_into(self._map, _PHASE_AT, seq, self._step, self._phase, self._collectives, time.monotonic(), seq)

    def _write_step(self, step_s: float, compute_s: float, wait_s: float, samples: int) -> None:
        self._sseq += 1
        seq = self._sseq
        _STEP.pack_into(self._map, _STEP_AT, seq, step_s, compute_s, wait_s, samples, *self._totals, seq)

    def phase(self, name: str, step: int | None = None) -> None:
        """Enter phase ``name`` (one of :data:`PHASES`), optionally at step ``step``."""
        if not self.enabled:
            return
        self._phase = _PHASE_CODE[name]
        if step is not None:
            self._step = step
        self._write_phase()

    def collective(self) -> None:
        """Enter a collective: the phase becomes ``collective`` and the collective count goes up by
        one, so that a report can say ``ranks 0-2 wait in collective #1204``."""
        if not self.enabled:
            return
        self._collectives += 1
        self._phase = _COLLECTIVE
        self._write_phase()

    def step_done(self, samples: int, compute_s: float, wait_s: float = 0.0, *, timed: bool = True) -> None:
        """One step finished: ``samples`` in it, its time split into computing and waiting (for data,
        for the other ranks). The step counter goes up by one; the phase stays. ``timed=False``: the
        step counts, its times do not (the timed steps and totals that judge stragglers stay)."""
        if not self.enabled:
            return
        if not timed:
            self._step += 1
            self._write_phase()
            return
        totals = self._totals
        totals[0] += 1
        totals[1] += samples
        totals[2] += compute_s
        totals[3] += wait_s
        self._write_step(compute_s + wait_s, compute_s, wait_s, samples)
        self._step += 1
        self._write_phase()

    def close(self) -> None:
        """The worker finished: phase ``done``; the stacks handler is removed."""
        if not self.enabled:
            return
        self.phase("done")
        self.enabled = False
        self._release()

    def _release(self) -> None:
        if self._stacks_file is not None:
            faulthandler.unregister(STACKS_SIGNAL)
            self._stacks_file.close()
            self._stacks_file = None
        if self._map is not None:
            self._map.close()
            self._map = None


_COLLECTIVE = _PHASE_CODE["collective"]


def read_one(path: str | os.PathLike, attempts: int = 1000) -> RankProgress | None:
    """One rank's record, or None when the file is not (yet) a record. Retries a torn read."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size < SIZE:
                return None
            view = mmap.mmap(f.fileno(), SIZE, prot=mmap.PROT_READ)
    except (FileNotFoundError, ValueError):
        return None
    with view:
        if view[:4] != _MAGIC:
            return None
        # Copies from the shared page (no system call between them, so the window a writer can hit
        # is a fraction of a microsecond): the tails before the body, the heads after it.
        for _ in range(attempts):
            before = view[_PHASE_AT:SIZE]
            data = view[:SIZE]
            after = view[_PHASE_AT:SIZE]
            if _whole(before, data, after, _PHASE, _PHASE_AT) and _whole(before, data, after, _STEP, _STEP_AT):
                return _decode(data, str(path))
            time.sleep(0.0001)
    return None


def _whole(before: bytes, data: bytes, after: bytes, region: struct.Struct, at: int) -> bool:
    # ``before`` and ``after`` start at _PHASE_AT.
    tail_at = at + region.size - 8
    (tail,) = _U64.unpack_from(before, tail_at - _PHASE_AT)
    (head,) = _U64.unpack_from(after, at - _PHASE_AT)
    return head == tail and _U64.unpack_from(data, at) == _U64.unpack_from(data, tail_at) == (head,)


_U64 = struct.Struct("<Q")


def _decode(data: bytes, path: str) -> RankProgress:
    _, _, pid, rank, local_rank, world_size, signum, started_wall, started_mono, host = _HEAD.unpack_from(data, 0)
    pseq, step, phase, collectives, since_mono, _ = _PHASE.unpack_from(data, _PHASE_AT)
    sseq, step_s, compute_s, wait_s, samples, steps_timed, total_samples, total_compute, total_wait, _ = (
        _STEP.unpack_from(data, _STEP_AT)
    )
    return RankProgress(
        rank=rank, pid=pid, local_rank=local_rank, world_size=world_size,
        host=host.rstrip(b"\0").decode(errors="replace"), started_wall=started_wall, stacks_signal=signum,
        seq=pseq + sseq, step=step, phase=PHASES[phase] if 0 <= phase < len(PHASES) else "?",
        collectives=collectives, phase_since_mono=since_mono,
        phase_since_wall=started_wall + (since_mono - started_mono), step_s=step_s, compute_s=compute_s,
        wait_s=wait_s, samples=samples, steps_timed=steps_timed, total_samples=total_samples,
        total_compute_s=total_compute, total_wait_s=total_wait, path=path,
    )  # fmt: skip


def read_progress(directory: str | os.PathLike) -> list[RankProgress]:
    """Every rank's record found in ``directory``, by rank (none when the directory is absent)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [read_one(path) for path in directory.glob("rank-*.progress")]
    return sorted((record for record in found if record is not None), key=lambda r: r.rank)


_SUMMARY_FIELDS = tuple(f.name for f in dataclasses.fields(RankProgress) if f.name not in ("path", "remote"))
"""What a summary carries of each record: all but this node's own (its file, the remote mark)."""


def to_summary(records: list[RankProgress]) -> bytes:
    """This node's records as a few hundred bytes per rank, for the launchers to share through the
    rendezvous store every few seconds."""
    fields = [{name: getattr(r, name) for name in _SUMMARY_FIELDS} for r in records]
    return json.dumps(fields, separators=(",", ":")).encode()


def from_summary(data: bytes) -> list[RankProgress]:
    """Another node's records from its :func:`to_summary` (marked ``remote``); fields this version
    does not know (a newer launcher's) are left out."""
    return [
        RankProgress(**{k: v for k, v in fields.items() if k in _SUMMARY_FIELDS}, remote=True)
        for fields in json.loads(data)
    ]


# -- the watchdog's verdict, read back by the workers -----------------------------------------------

VERDICT_FILE = "verdict.json"
"""The launcher's watchdog's verdict in the progress directory, replaced atomically whenever it
changes: ``{"time": unix s, "stragglers": [{"rank", "node", "ratio", "line"}], "hang": null or
{"line"}}``. Rank 0's trainer reads its straggler lines once per epoch (metrics.jsonl)."""


def write_verdict(path: str | os.PathLike, stragglers: list[dict], hang_line: str | None) -> None:
    """The launcher's side: :data:`VERDICT_FILE`'s content at ``path`` (a reader sees the old or the new one)."""
    from shoal.atomic import atomic_write_text

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "time": time.time(),
        "stragglers": list(stragglers),
        "hang": None if hang_line is None else {"line": hang_line},
    }
    atomic_write_text(path, json.dumps(data) + "\n")


def read_straggler_lines(directory: str | os.PathLike) -> list[str]:
    """The workers' side: the straggler lines of the latest verdict in ``directory``; ``[]`` without
    one, or with one this version cannot read (the epoch's record then goes without)."""
    try:
        with open(Path(directory) / VERDICT_FILE) as f:
            verdict = json.load(f)
        return [str(s["line"]) for s in verdict.get("stragglers") or ()]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return []
