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

Duplicate names: a named op is pending until :func:`~.ops.synchronize` (or until its handle is
dropped); submitting another under the same name before that is Horovod's ``DUPLICATE_NAME_ERROR``
(``horovod/common/common.h``). The flag travels in the digest, so every rank raises, not only the
one that erred while the others wait in the next collective.
"""

from __future__ import annotations

import enum
import hashlib
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from shoal.errors import ShoalError
from shoal.integrations.horovod import state
from shoal.integrations.horovod.errors import HorovodMismatchError, HorovodUsageError

# torch 2.14 renamed all_gather_into_tensor to all_gather_single and warns at every call of the old name.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

INLINE_FIRSTS = 8
"""First dimensions that travel in the digest's vector; a grouped allgather of more takes one more round."""


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

_pending: dict[str, weakref.ref] = {}


def is_pending(name: str | None) -> bool:
    """True while an op submitted under ``name`` on this rank has not been synchronized."""
    ref = _pending.get(name) if name else None
    return ref is not None and ref() is not None


def hold(name: str | None, handle: Any) -> None:
    """Mark ``name`` pending until :func:`release` (or until ``handle`` is garbage)."""
    if name:
        _pending[name] = weakref.ref(handle)


def release(name: str | None, handle: Any) -> None:
    ref = _pending.get(name) if name else None
    if ref is not None and ref() in (handle, None):
        del _pending[name]


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
    group = state.object_group()
    inline = firsts[:INLINE_FIRSTS]
    padding = [0] * (INLINE_FIRSTS - len(inline))
    vector = torch.tensor([mine.digest(), len(tensors), *inline, *padding], dtype=torch.int64)
    everyone = torch.empty(world * vector.numel(), dtype=torch.int64)
    _all_gather(everyone, vector, group=group)
    rows = everyone.view(world, -1).tolist()
    if any(row[0] != rows[0][0] for row in rows):
        submissions: list[Any] = [None] * world
        dist.all_gather_object(submissions, mine, group=group)
        raise explain(submissions)
    if mine.duplicate or mine.problem:  # equal digests: every rank has the same flag
        raise explain([mine] * world)
    count = len(tensors)
    if count <= INLINE_FIRSTS:
        return [row[2 : 2 + count] for row in rows]
    gathered = torch.empty(world * count, dtype=torch.int64)
    _all_gather(gathered, torch.tensor(firsts, dtype=torch.int64), group=group)
    return gathered.view(world, count).tolist()


# ---- the error ------------------------------------------------------------------------------------

_SETTING_HINTS = {
    "op": "pass the same op on every rank (Horovod: 'Mismatched reduction operation')",
    "prescale_factor": "pass the same prescale_factor on every rank (Horovod: 'Mismatched prescale and/or postscale factors')",
    "postscale_factor": "pass the same postscale_factor on every rank (Horovod: 'Mismatched prescale and/or postscale factors')",
    "root_rank": "pass the same root_rank on every rank (Horovod: 'Mismatched root ranks')",
}
_ORDER_HINT = "every rank must issue the same collectives, with the same names, in the same order"


def explain(submissions: Sequence[Submission]) -> ShoalError:
    """The error every rank raises for these submissions (rank r's at index r): the same text on each."""
    ref = submissions[0]
    head = f"hvd.{ref.call}" + (f" {ref.name!r}" if ref.name else "")
    for rank, sub in enumerate(submissions):
        if sub.problem:
            message, hint = sub.problem
            return HorovodUsageError(f"{head}: " + (f"rank {rank}: " if len(submissions) > 1 else "") + message, hint)
    for rank, sub in enumerate(submissions):
        if sub.duplicate:
            return HorovodUsageError(
                f"{head}: rank {rank} submitted it while an earlier op named {sub.name!r} was still pending "
                "(Horovod's DUPLICATE_NAME_ERROR)",
                "call hvd.synchronize(handle) on the earlier op first, or give each op in flight its own name",
            )
    for rank, sub in enumerate(submissions[1:], start=1):
        found = _difference(rank, sub, ref)
        if found is not None:
            what, hint = found
            return HorovodMismatchError(f"{head}: {what}", hint)
    return HorovodMismatchError(f"{head}: the ranks submitted different collectives", _ORDER_HINT)


def _difference(rank: int, sub: Submission, ref: Submission) -> tuple[str, str] | None:
    """How rank ``rank``'s ``sub`` differs from rank 0's ``ref`` (the first difference), and the hint."""
    who = f"rank {rank}"
    if sub.call != ref.call:
        return f"{who} called hvd.{sub.call}, rank 0 hvd.{ref.call} (Horovod: 'Mismatched operations')", _ORDER_HINT
    if sub.name != ref.name:
        return f"{who} named it {sub.name!r}, rank 0 {ref.name!r}", _ORDER_HINT
    if len(sub.tensors) != len(ref.tensors):
        return f"{who} passed {len(sub.tensors)} tensors, rank 0 {len(ref.tensors)}", _SAME_LIST_HINT
    for (key, value), (_, ref_value) in zip(sub.settings, ref.settings):
        if value != ref_value:
            hint = _SETTING_HINTS.get(key, f"pass the same {key} on every rank")
            return f"{who} has {key}={value}, rank 0 {key}={ref_value}", hint
    grouped = len(ref.tensors) > 1 or ref.call.startswith("grouped_")
    for index, ((shape, dtype, device), (ref_shape, ref_dtype, ref_device)) in enumerate(zip(sub.tensors, ref.tensors)):
        which = f"tensor {index}: {who}" if grouped else who
        if dtype != ref_dtype:
            return f"{which} has dtype {dtype}, rank 0 {ref_dtype}", _DTYPE_HINT
        if sub.compared_shape(shape) != ref.compared_shape(ref_shape):
            hint = _RAGGED_SHAPE_HINT if ref.ragged else _SHAPE_HINT
            return f"{which} has shape {list(shape)}, rank 0 has {list(ref_shape)}", hint
        if device != ref_device:
            return f"{which} has it on {device}, rank 0 on {ref_device}", _DEVICE_HINT
    return None


_SAME_LIST_HINT = "pass the same list of tensors on every rank"
_DTYPE_HINT = "cast to one dtype on every rank (Horovod: 'Mismatched data types')"
_SHAPE_HINT = "pass a tensor of the same shape on every rank (Horovod: 'Mismatched ... tensor shapes')"
_RAGGED_SHAPE_HINT = "the shapes may differ only in the first dimension (Horovod: 'Mismatched ... tensor shapes')"
_DEVICE_HINT = (
    "put the tensor on the same kind of device on every rank (Horovod: 'Mismatched CPU/GPU device selection')"
)


__all__ = ["Submission", "agree", "describe", "explain", "hold", "is_pending", "release"]
