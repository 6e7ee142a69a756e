"""Parameters, optimizer state and Python objects across ranks (Horovod's ``horovod/torch/functions.py``).

- :func:`broadcast_parameters`: root's tensors into every rank's, in place, a few flat buckets at a
  time (not one collective per tensor).
- :func:`broadcast_optimizer_state`: root's optimizer state (tensors and hyper-parameters such as
  ``lr``) loaded into every rank's optimizer. Unlike Horovod, a fresh optimizer is not first given
  a zero-gradient ``step()`` to create its state: that step advances Adam's step count (and moves
  weights under weight decay), so the run would differ from the same run under DDP. A fresh
  optimizer's state stays empty on every rank, as it is on the root; its trainable parameters
  without a gradient get a zero one, as Horovod's step leaves them.
- :func:`broadcast_object` / :func:`allgather_object`: any picklable object (torch's pickle-based
  object collectives; Horovod's used cloudpickle, so lambdas do not travel here).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from shoal.horovod import agreement, buckets, dtypes, state
from shoal.horovod.errors import HorovodUsageError
from shoal.horovod.exchange import check_root
from shoal.horovod.ops import check_ready


def check_same_on_every_rank(signature: list[Any], what: str, hint: str, *, call: str = "broadcast") -> None:
    """Every rank's ``signature`` (a list) must equal rank 0's; ``call`` names the collective it precedes.

    All ranks compare the same gathered lists, so all of them raise the same HorovodUsageError
    (naming the first rank and entry that differ) or none does: no rank is left waiting. An
    agreement round comes first (:mod:`.agreement`): a rank in another collective, or inside
    ``hvd.join()``, gets a clear error instead of a mismatched gather.
    """
    job = state.job("check")
    if job.context.world_size == 1:
        return
    agreement.agree(call, [])
    everyone: list[Any] = [None] * job.context.world_size
    dist.all_gather_object(everyone, signature, group=state.object_group())
    reference = everyone[0]
    for other, theirs in enumerate(everyone[1:], start=1):
        if theirs == reference:
            continue
        detail = _first_difference(reference, theirs, other)
        raise HorovodUsageError(f"{what} differ across ranks: {detail}", hint)


def _first_difference(reference: list[Any], theirs: list[Any], other: int) -> str:
    """Where rank ``other``'s signature first departs from rank 0's, in words."""
    for index, (at_zero, at_other) in enumerate(zip(reference, theirs)):
        if at_zero == at_other:
            continue
        if (
            isinstance(at_zero, tuple)
            and isinstance(at_other, tuple)
            and len(at_zero) == len(at_other) == 3
            and at_zero[0] == at_other[0]
        ):
            return f"{at_zero[0]} is {list(at_other[1])} {at_other[2]} on rank {other} but {list(at_zero[1])} {at_zero[2]} on rank 0"
        return f"entry {index} is {_describe(at_other)} on rank {other} but {_describe(at_zero)} on rank 0"
    return f"rank {other} has {len(theirs)} entries, rank 0 has {len(reference)}"


def _describe(entry: Any) -> str:
    if isinstance(entry, tuple) and len(entry) == 3:
        name, shape, dtype = entry
        return f"{name} {list(shape)} {dtype}"
    return repr(entry)


def tensor_signature(named: Iterable[tuple[str | None, torch.Tensor]]) -> list[tuple[str, tuple[int, ...], str]]:
    """``(name, shape, dtype)`` per tensor: what must agree across ranks before tensors are paired up."""
    return [(str(name), tuple(t.shape), str(t.dtype).replace("torch.", "")) for name, t in named]


def broadcast_tensors_(tensors: list[torch.Tensor], root_rank: int) -> None:
    """Overwrite ``tensors`` in place with root_rank's, one broadcast per bucket (all started, then waited)."""
    if not tensors or state.size() == 1:
        return
    first_cap, cap = buckets.bucket_caps()
    in_flight = []
    with torch.no_grad():
        for indices in buckets.plan_buckets(tensors, first_cap, cap):
            members = [tensors[i] for i in indices]
            wire = dtypes.wire_dtype(members[0].dtype)  # int16 buffers travel as int32
            flat = torch.empty(buckets.total_numel(members), dtype=wire, device=members[0].device)
            if state.rank() == root_rank:
                buckets.pack(members, flat)
            work = dist.broadcast(flat, src=root_rank, group=state.group_for(flat), async_op=True)
            in_flight.append((work, flat, members))
        for work, flat, members in in_flight:
            work.wait()
            if state.rank() != root_rank:
                buckets.unpack(flat, members)


def broadcast_parameters(params: Any, root_rank: int) -> None:
    """Overwrite every rank's tensors with root_rank's, in place.

    ``params``: ``model.state_dict()`` (parameters and buffers; taken in sorted key order, as
    Horovod does), ``model.named_parameters()`` or ``model.parameters()`` (a list or any iterable).
    Every rank must pass the same names, shapes and dtypes; checked once (one small collective),
    with a HorovodUsageError on every rank naming the first difference.
    """
    check_ready("broadcast_parameters()")
    check_root(root_rank, "broadcast_parameters()")
    if isinstance(params, Mapping):
        named = sorted(params.items())
    elif isinstance(params, Iterable) and not isinstance(params, (torch.Tensor, str, bytes)):
        named = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise HorovodUsageError(
            f"hvd.broadcast_parameters: params of type {type(params).__name__} is not a dict or a list",
            "pass model.state_dict(), model.named_parameters() or model.parameters()",
        )
    for name, tensor in named:
        if not isinstance(tensor, torch.Tensor):
            raise HorovodUsageError(
                f"hvd.broadcast_parameters: {name or 'an entry'} is a {type(tensor).__name__}, not a tensor",
                "pass model.state_dict(), model.named_parameters() or model.parameters()",
            )
    check_same_on_every_rank(
        tensor_signature(named),
        "hvd.broadcast_parameters: the tensors",
        "build the same model (same layers in the same order) on every rank before broadcasting it",
        call="broadcast_parameters",
    )
    broadcast_tensors_([tensor for _, tensor in named], root_rank)


@dataclass(frozen=True)
class _Slot:
    """Where a tensor sat in the root's optimizer state dict; the tensor itself travels separately."""

    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    on_gpu: bool
    """On a GPU at the root: received on this rank's GPU; else on the CPU (as Adam's ``step``)."""


def _split_tensors(value: Any, tensors: list[torch.Tensor]) -> Any:
    """``value`` with every tensor replaced by a :class:`_Slot`; the tensors appended to ``tensors``."""
    if isinstance(value, torch.Tensor):
        tensors.append(value.detach())
        return _Slot(len(tensors) - 1, tuple(value.shape), value.dtype, value.device.type == "cuda")
    if isinstance(value, dict):
        return {key: _split_tensors(item, tensors) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_split_tensors(item, tensors) for item in value)
    return value


def _fill_tensors(value: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(value, _Slot):
        return tensors[value.index]
    if isinstance(value, dict):
        return {key: _fill_tensors(item, tensors) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_fill_tensors(item, tensors) for item in value)
    return value


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int, model: Any = None) -> None:
    """Make every rank's optimizer state (tensors and hyper-parameters) root_rank's.

    The root's ``state_dict()`` travels as a small pickled skeleton plus its tensors in flat
    buckets, and is loaded with ``load_state_dict`` on the other ranks. ``model`` is accepted for
    Horovod's signature (it named sparse parameters there) and not needed.
    """
    check_ready("broadcast_optimizer_state()")
    check_root(root_rank, "broadcast_optimizer_state()")
    if isinstance(optimizer, torch.optim.LBFGS):
        raise HorovodUsageError(
            "hvd.broadcast_optimizer_state: torch.optim.LBFGS state cannot be broadcast (as in Horovod)",
            "broadcast the model with hvd.broadcast_parameters and let each rank start LBFGS afresh",
        )
    if not optimizer.state:
        _zero_missing_gradients(optimizer, model)
    if state.size() == 1:
        return
    is_root = state.rank() == root_rank
    tensors: list[torch.Tensor] = []
    skeleton = _split_tensors(optimizer.state_dict(), tensors) if is_root else None
    skeleton = broadcast_object(skeleton, root_rank)
    slots: list[_Slot] = []
    _collect_slots(skeleton, slots)
    # Each tensor travels where it lives on the root (CPU tensors over gloo, GPU tensors over NCCL);
    # load_state_dict then puts it where this rank's optimizer keeps it.
    if is_root:
        tensors = [t.contiguous() for t in tensors]
    else:
        tensors = [
            torch.empty(slot.shape, dtype=slot.dtype, device=_receive_device(slot))
            for slot in sorted(slots, key=_index)
        ]
    broadcast_tensors_(tensors, root_rank)
    if not is_root:
        try:
            optimizer.load_state_dict(_fill_tensors(skeleton, tensors))
        except (ValueError, KeyError) as err:
            raise HorovodUsageError(
                f"hvd.broadcast_optimizer_state: rank {root_rank}'s optimizer state does not fit rank "
                f"{state.rank()}'s optimizer: {str(err).splitlines()[0]}",
                "create the same optimizer (same parameter groups, same parameters) on every rank",
            ) from None


def _zero_missing_gradients(optimizer: torch.optim.Optimizer, model: Any) -> None:
    """A zero gradient for each trainable parameter that has none, as Horovod leaves a fresh optimizer.

    (Horovod sets them to run its state-creating step; shoal takes no step, and a gradient already
    there is kept.) Sparse for ``SparseAdam`` and, as Horovod, for SGD over ``model``'s sparse
    embeddings, so that the next backward still accumulates a sparse gradient.
    """
    sparse_ids = set()
    if model is not None:
        for module in model.modules():
            if isinstance(module, torch.nn.Embedding) and module.sparse:
                sparse_ids.update(id(p) for p in module.parameters())
    with torch.no_grad():
        for group in optimizer.param_groups:
            for param in group["params"]:
                if not param.requires_grad or param.grad is not None:
                    continue
                sparse = param.dim() > 0 and (
                    isinstance(optimizer, torch.optim.SparseAdam)
                    or (isinstance(optimizer, torch.optim.SGD) and id(param) in sparse_ids)
                )
                param.grad = _empty_sparse_like(param) if sparse else torch.zeros_like(param)


def _empty_sparse_like(param: torch.Tensor) -> torch.Tensor:
    """A sparse zero shaped like ``param``, in an embedding gradient's layout (rows sparse, the rest dense)."""
    indices = torch.zeros((1, 0), dtype=torch.int64, device=param.device)
    values = param.new_zeros((0, *param.shape[1:]))
    return torch.sparse_coo_tensor(indices, values, param.shape)


def _index(slot: _Slot) -> int:
    return slot.index


def _collect_slots(value: Any, slots: list[_Slot]) -> None:
    if isinstance(value, _Slot):
        slots.append(value)
    elif isinstance(value, dict):
        for item in value.values():
            _collect_slots(item, slots)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect_slots(item, slots)


def _receive_device(slot: _Slot) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if slot.on_gpu else torch.device("cpu")


def broadcast_object(
    obj: Any, root_rank: int = 0, name: str | None = None, process_set: Any = state.global_process_set
) -> Any:
    """root_rank's ``obj`` (anything picklable) on every rank."""
    job = check_ready("broadcast_object()")
    state.check_process_set(process_set, "broadcast_object")
    check_root(root_rank, "broadcast_object()")
    if job.context.world_size == 1:
        return obj
    agreement.agree("broadcast_object", [], name, {"root_rank": root_rank})
    box = [obj if state.rank() == root_rank else None]
    dist.broadcast_object_list(box, src=root_rank, group=state.object_group())
    return box[0]


def allgather_object(obj: Any, name: str | None = None, process_set: Any = state.global_process_set) -> list[Any]:
    """Every rank's ``obj``, in rank order."""
    job = check_ready("allgather_object()")
    state.check_process_set(process_set, "allgather_object")
    if job.context.world_size == 1:
        return [obj]
    agreement.agree("allgather_object", [], name)
    everyone: list[Any] = [None] * job.context.world_size
    dist.all_gather_object(everyone, obj, group=state.object_group())
    return everyone
