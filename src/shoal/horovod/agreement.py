"""Horovod's cross-rank checks: before a collective moves data, every rank learns what the others submitted.

Horovod's coordinator (``horovod/common/controller.cc``, Horovod 0.28) compares the requests of all
ranks for one tensor and answers every rank with an error when they disagree ("Mismatched data
types", "Mismatched allreduce tensor shapes", "Mismatched reduction operation", "Mismatched ...
root ranks", "Mismatched prescale and/or postscale factors"). torch.distributed pairs collectives
by the order ranks issue them and checks nothing: a mismatch hangs, crashes the peer or garbles the
result. So each user-called collective first all-gathers one small int64 vector per rank:

- a 64-bit digest of what this rank submits: the call, the name, the settings (op, scale factors,
  root_rank), each tensor's dtype, device kind and shape (without the first dimension where ranks
  may differ: allgather, alltoall);
- the number of tensors and the first dimensions of the first few (allgather needs them anyway).

Equal digests: the collective goes ahead, one ~100-byte all_gather later. Different digests: every
rank all-gathers the full descriptions and raises the same one-line error naming the first rank
that differs from rank 0 and what differs, e.g. ``hvd.allreduce 'grad.w': rank 1 has shape [3, 4],
rank 0 has [4, 3]``. The DistributedOptimizer's gradient buckets do not come through here: their
layout is checked once when it is built, and every step's reductions follow it by construction.

Duplicate names: a named op is pending until :func:`~.ops.synchronize` (a dropped handle does not
end it: the job keeps the handle until then); submitting another under the same name before
that is Horovod's ``DUPLICATE_NAME_ERROR`` (``horovod/common/common.h``). The flag travels in the
digest, so every rank raises, not only the one that erred while the others wait in the next
collective.

Joined ranks: a rank inside ``hvd.join()`` with no DistributedOptimizer to shadow takes part in
every round with the :data:`JOINED` marker instead of a digest (:func:`listen`). The others then
gather the full descriptions, so the joined rank learns what they run: an allreduce (op Sum or
Average) it answers with zeros, a barrier needs nothing more, anything else every active rank
refuses with the same error (Horovod: "... is not supported with Join at this time").
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from shoal.errors import ShoalError
from shoal.horovod import state
from shoal.horovod.errors import HorovodMismatchError, HorovodUsageError

# torch 2.14 renamed all_gather_into_tensor to all_gather_single and warns at every call of the old name.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

INLINE_FIRSTS = 8
"""First dimensions that travel in the digest's vector; a grouped allgather of more takes one more round."""

JOINED = -0x4A4F494E4544
"""The digest slot of a rank inside ``hvd.join()`` (:func:`listen`); a real digest equals it with odds 2**-64."""

BESIDE_JOINED = {"allreduce", "grouped_allreduce", "barrier"}
"""The calls that go on while a rank has joined: allreduces, as Horovod lets them through (here with
op Sum or Average only: Min, Max and Product would take the joined rank's zeros as values), and barrier."""


@dataclass(frozen=True)
class Submission:
    """What one rank submits to one collective; ranks must submit equal ones (up to first dimensions)."""

    call: str
    name: str | None
    settings: tuple[tuple[str, str], ...]
    tensors: tuple[tuple[tuple[int, ...], str, str], ...]
    """(shape, dtype, device kind) per tensor."""
    ragged: bool
    """The first dimensions may differ between ranks (allgather, alltoall)."""
    duplicate: bool
    problem: tuple[str, str] | None = None
    """(message, hint) of bad input this rank found in its own arguments (e.g. alltoall's splits)."""

    def compared_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (len(shape), *shape[1:]) if self.ragged else shape

    def digest(self) -> int:
        """A signed 64-bit digest of everything ranks must agree on."""
        compared = (
            self.call,
            self.name,
            self.settings,
            tuple((self.compared_shape(shape), dtype, device) for shape, dtype, device in self.tensors),
            self.duplicate,
            self.problem,
        )
        raw = hashlib.blake2b(repr(compared).encode(), digest_size=8).digest()
        return int.from_bytes(raw, "little", signed=True)


# ---- pending names --------------------------------------------------------------------------------


def _pending() -> dict[str, Any]:
    """This job's pending names (:attr:`~.state._Job.pending`); none without a job."""
    return state._job.pending if state._job is not None else {}


def is_pending(name: str | None) -> bool:
    """True while an op submitted under ``name`` on this rank has not been synchronized."""
    return bool(name) and name in _pending()


def hold(name: str | None, handle: Any) -> None:
    """Mark ``name`` pending until :func:`release` (the job keeps ``handle`` until then)."""
    if name:
        _pending()[name] = handle


def release(name: str | None, handle: Any) -> None:
    pending = _pending()
    if name and pending.get(name) is handle:
        del pending[name]


# ---- the check ------------------------------------------------------------------------------------


def _show(value: Any) -> str:
    return value.name if isinstance(value, enum.Enum) else str(value)


def describe(
    call: str,
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    settings: Mapping[str, Any] | None = None,
    *,
    ragged: bool = False,
    problem: tuple[str, str] | None = None,
) -> Submission:
    """This rank's :class:`Submission`."""
    return Submission(
        call=call,
        name=name,
        settings=tuple((key, _show(value)) for key, value in (settings or {}).items()),
        tensors=tuple((tuple(t.shape), str(t.dtype).replace("torch.", ""), t.device.type) for t in tensors),
        ragged=ragged,
        duplicate=is_pending(name),
        problem=problem,
    )


def agree(
    call: str,
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    settings: Mapping[str, Any] | None = None,
    *,
    ragged: bool = False,
    problem: tuple[str, str] | None = None,
) -> list[list[int]]:
    """Check that every rank submits the same collective; every rank's first dimensions, per tensor.

    Raises the same error on every rank when they disagree (see the module docstring), or when a
    rank passes a ``problem`` (bad input only it can see, such as its own alltoall splits: raising
    it on that rank alone would leave the others waiting in the next collective). With one process
    only the duplicate-name and ``problem`` checks run. ``ragged`` tensors must have a first dimension.
    """
    mine = describe(call, tensors, name, settings, ragged=ragged, problem=problem)
    firsts = [t.shape[0] if t.dim() else 1 for t in tensors]
    world = state.size()
    if world == 1:
        if mine.duplicate or mine.problem:
            raise explain([mine])
        return [firsts]
    count = len(tensors)
    inline = firsts[:INLINE_FIRSTS]
    rows = _round([mine.digest(), count, *inline])
    joined = any(row[0] == JOINED for row in rows)
    if joined or any(row[0] != rows[0][0] for row in rows):
        submissions = _gather_submissions(mine)
        error = explain(submissions) if not joined else beside_joined(submissions)
        if error is not None:
            raise error
        return [row[2 : 2 + count] for row in rows]  # only allreduces and barriers get here: firsts unused
    if mine.duplicate or mine.problem:  # equal digests: every rank has the same flag
        raise explain([mine] * world)
    if count <= INLINE_FIRSTS:
        return [row[2 : 2 + count] for row in rows]
    gathered = torch.empty(world * count, dtype=torch.int64)
    _all_gather(gathered, torch.tensor(firsts, dtype=torch.int64), group=state.object_group())
    return gathered.view(world, count).tolist()


def _round(values: list[int]) -> list[list[int]]:
    """Every rank's ``values`` (a digest or :data:`JOINED`, then up to 9 numbers), one all_gather.

    Counts the round in ``rounds`` of the job: every rank counts the same rounds, so ``hvd.join()``
    can tell which rank joined last.
    """
    job = state.job("agree")
    vector = torch.tensor(values + [0] * (2 + INLINE_FIRSTS - len(values)), dtype=torch.int64)
    everyone = torch.empty(job.context.world_size * vector.numel(), dtype=torch.int64)
    _all_gather(everyone, vector, group=state.object_group())
    job.rounds += 1
    return everyone.view(job.context.world_size, -1).tolist()


def _gather_submissions(mine: Submission | None) -> list[Submission | None]:
    """Every rank's full description (None from a joined rank), in rank order."""
    submissions: list[Any] = [None] * state.size()
    dist.all_gather_object(submissions, mine, group=state.object_group())
    return submissions


@dataclass(frozen=True)
class Joined:
    """What one :func:`listen` round asks of the joined rank."""

    done: bool
    """Every rank is inside ``hvd.join()``: leave."""
    last: int = -1
    """When done: the rank that joined last (the latest round, ties to the higher rank)."""
    reduce: Submission | None = None
    """The others run this allreduce: answer it with zeros (:func:`~.ops.reduce_zeros`)."""


def listen(joined_at: int) -> Joined:
    """One round of a rank inside ``hvd.join()`` with no DistributedOptimizer: the others' next call.

    ``joined_at`` is the round at which this rank joined; it travels in the marker so that, once
    every rank has joined, all of them name the same last rank without another collective.
    """
    rows = _round([JOINED, joined_at])
    if all(row[0] == JOINED for row in rows):
        last = max(range(len(rows)), key=lambda rank: (rows[rank][1], rank))
        return Joined(done=True, last=last)
    submissions = _gather_submissions(None)
    active = next(sub for sub in submissions if sub is not None)
    if beside_joined(submissions) is None and active.call != "barrier":
        return Joined(done=False, reduce=active)
    return Joined(done=False)


def beside_joined(submissions: Sequence[Submission | None]) -> ShoalError | None:
    """The error every active rank raises for a call made while the ranks at None have joined, or None.

    Ranks that disagree among themselves get the usual error; beyond that only :data:`BESIDE_JOINED`
    calls go on, allreduces only with op Sum or Average (a joined rank's zeros mean nothing to Min,
    Max or Product).
    """
    found = first_error(submissions)
    if found is not None:
        return found
    joined = next(rank for rank, sub in enumerate(submissions) if sub is None)
    active = next(sub for sub in submissions if sub is not None)
    op = dict(active.settings).get("op")
    if active.call in BESIDE_JOINED and op in (None, "Sum", "Average"):
        return None
    who = f"hvd.{active.call}" + (f" {active.name!r}" if active.name else "")
    head = f"{who}: rank {joined} has called hvd.join(), and "
    if active.call in BESIDE_JOINED:
        return HorovodMismatchError(
            head + f"op={op} cannot go on beside a joined rank: its zeros would count as values",
            "reduce with op=hvd.Sum or hvd.Average while a rank has joined, or call hvd.join() on every rank first",
        )
    kind = _HOROVOD_KIND.get(active.call.removeprefix("grouped_"))
    horovod = f" (Horovod: '{kind} is not supported with Join at this time')" if kind else ""
    return HorovodMismatchError(
        head + "only allreduce and barrier go on beside a joined rank" + horovod,
        f"call hvd.join() on every rank first, then hvd.{active.call}",
    )


_HOROVOD_KIND = {
    "allgather": "Allgather",
    "allgather_object": "Allgather",
    "sparse_allreduce": "Allgather",  # Horovod gathers sparse tensors
    "broadcast": "Broadcast",
    "broadcast_object": "Broadcast",
    "broadcast_parameters": "Broadcast",
    "alltoall": "Alltoall",
    "reducescatter": "Reducescatter",
}
"""How Horovod's coordinator names each collective it refuses beside a joined rank."""


# ---- the error ------------------------------------------------------------------------------------

_SETTING_HINTS = {
    "op": "pass the same op on every rank (Horovod: 'Mismatched reduction operation')",
    "prescale_factor": "pass the same prescale_factor on every rank (Horovod: 'Mismatched prescale and/or postscale factors')",
    "postscale_factor": "pass the same postscale_factor on every rank (Horovod: 'Mismatched prescale and/or postscale factors')",
    "root_rank": "pass the same root_rank on every rank (Horovod: 'Mismatched root ranks')",
}
_ORDER_HINT = "every rank must issue the same collectives, with the same names, in the same order"


def explain(submissions: Sequence[Submission | None]) -> ShoalError:
    """The error every rank raises for these submissions (rank r's at index r): the same text on each."""
    found = first_error(submissions)
    if found is not None:
        return found
    ref = next(sub for sub in submissions if sub is not None)
    head = f"hvd.{ref.call}" + (f" {ref.name!r}" if ref.name else "")
    return HorovodMismatchError(f"{head}: the ranks submitted different collectives", _ORDER_HINT)


def first_error(submissions: Sequence[Submission | None]) -> ShoalError | None:
    """The first problem, duplicate name or difference from the first rank's submission, or None.

    None entries (ranks inside ``hvd.join()``) are skipped; the first other rank is the reference.
    """
    present = [(rank, sub) for rank, sub in enumerate(submissions) if sub is not None]
    ref_rank, ref = present[0]
    head = f"hvd.{ref.call}" + (f" {ref.name!r}" if ref.name else "")
    for rank, sub in present:
        if sub.problem:
            message, hint = sub.problem
            return HorovodUsageError(f"{head}: " + (f"rank {rank}: " if len(submissions) > 1 else "") + message, hint)
    for rank, sub in present:
        if sub.duplicate:
            return HorovodUsageError(
                f"{head}: rank {rank} submitted it while an earlier op named {sub.name!r} was still pending "
                "(Horovod's DUPLICATE_NAME_ERROR)",
                "call hvd.synchronize(handle) on the earlier op first, or give each op in flight its own name",
            )
    for rank, sub in present[1:]:
        found = _difference(rank, sub, ref_rank, ref)
        if found is not None:
            what, hint = found
            return HorovodMismatchError(f"{head}: {what}", hint)
    return None


def _difference(rank: int, sub: Submission, ref_rank: int, ref: Submission) -> tuple[str, str] | None:
    """How rank ``rank``'s ``sub`` differs from rank ``ref_rank``'s ``ref`` (the first difference), and the hint."""
    who, them = f"rank {rank}", f"rank {ref_rank}"
    if sub.call != ref.call:
        return f"{who} called hvd.{sub.call}, {them} hvd.{ref.call} (Horovod: 'Mismatched operations')", _ORDER_HINT
    if sub.name != ref.name:
        return f"{who} named it {sub.name!r}, {them} {ref.name!r}", _ORDER_HINT
    if len(sub.tensors) != len(ref.tensors):
        return f"{who} passed {len(sub.tensors)} tensors, {them} {len(ref.tensors)}", _SAME_LIST_HINT
    for (key, value), (_, ref_value) in zip(sub.settings, ref.settings):
        if value != ref_value:
            hint = _SETTING_HINTS.get(key, f"pass the same {key} on every rank")
            return f"{who} has {key}={value}, {them} {key}={ref_value}", hint
    grouped = len(ref.tensors) > 1 or ref.call.startswith("grouped_")
    for index, ((shape, dtype, device), (ref_shape, ref_dtype, ref_device)) in enumerate(zip(sub.tensors, ref.tensors)):
        which = f"tensor {index}: {who}" if grouped else who
        if dtype != ref_dtype:
            return f"{which} has dtype {dtype}, {them} {ref_dtype}", _DTYPE_HINT
        if sub.compared_shape(shape) != ref.compared_shape(ref_shape):
            hint = _RAGGED_SHAPE_HINT if ref.ragged else _SHAPE_HINT
            return f"{which} has shape {list(shape)}, {them} has {list(ref_shape)}", hint
        if device != ref_device:
            return f"{which} has it on {device}, {them} on {ref_device}", _DEVICE_HINT
    return None


_SAME_LIST_HINT = "pass the same list of tensors on every rank"
_DTYPE_HINT = "cast to one dtype on every rank (Horovod: 'Mismatched data types')"
_SHAPE_HINT = "pass a tensor of the same shape on every rank (Horovod: 'Mismatched ... tensor shapes')"
_RAGGED_SHAPE_HINT = "the shapes may differ only in the first dimension (Horovod: 'Mismatched ... tensor shapes')"
_DEVICE_HINT = (
    "put the tensor on the same kind of device on every rank (Horovod: 'Mismatched CPU/GPU device selection')"
)


__all__ = [
    "JOINED",
    "Joined",
    "Submission",
    "agree",
    "beside_joined",
    "describe",
    "explain",
    "first_error",
    "hold",
    "is_pending",
    "listen",
    "release",
]
