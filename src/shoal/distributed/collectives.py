"""Small collective helpers that do the right thing with one process too."""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any, TypeVar, overload

import torch
import torch.distributed as dist

T = TypeVar("T")


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if is_initialized() else 0


def barrier() -> None:
    """Wait for every rank; a no-op with one process."""
    if is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


@overload
def all_reduce_mean(value: torch.Tensor) -> torch.Tensor: ...
@overload
def all_reduce_mean(value: Mapping[str, float | torch.Tensor]) -> dict[str, float]: ...


def all_reduce_mean(value):
    """The mean over ranks of a tensor, or of every number in a ``{name: number}`` dict.

    A tensor comes back as a new tensor (the input is left alone). A dict is packed into one tensor
    so the whole dict costs a single all-reduce, and comes back as ``{name: float}``.
    """
    if isinstance(value, torch.Tensor):
        out = value.detach().clone()
        if world_size() > 1:
            dist.all_reduce(out, op=dist.ReduceOp.SUM)
            out /= dist.get_world_size()
        return out
    if isinstance(value, Mapping):
        keys = list(value)
        packed = torch.tensor([float(value[k]) for k in keys], dtype=torch.float64, device=collective_device())
        packed = all_reduce_mean(packed)
        return {k: float(v) for k, v in zip(keys, packed.tolist())}
    raise TypeError(f"all_reduce_mean takes a tensor or a dict of numbers, not {type(value).__name__}")


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The sum over ranks of ``tensor`` (a new tensor)."""
    out = tensor.detach().clone()
    if world_size() > 1:
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def broadcast_object(obj: T, src: int = 0) -> T:
    """``obj`` as rank ``src`` has it, on every rank (any picklable object)."""
    if world_size() <= 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, device=collective_device())
    return box[0]


def print0(*args: Any, **kwargs: Any) -> None:
    """``print`` on rank 0 only (flushed, so lines from workers are not held back in buffers)."""
    if rank() == 0:
        kwargs.setdefault("flush", True)
        builtins.print(*args, **kwargs)


def collective_device() -> torch.device:
    """The device a collective of this group moves tensors on: CUDA under NCCL, else the CPU."""
    # NCCL only moves CUDA tensors; gloo moves CPU tensors.
    if is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
