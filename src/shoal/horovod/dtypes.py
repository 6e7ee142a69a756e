"""The dtype a tensor travels in: its own, or a wider one where the backend lacks it.

Horovod moves int16 tensors (allgather, broadcast, alltoall; ``horovod/torch/mpi_ops_v2.cc`` of
Horovod 0.28 registers ``ShortTensor`` for them); neither gloo nor NCCL has int16 (gloo raises
"Invalid scalar type"). Such a tensor travels as int32, which holds every int16 value, and comes
back as int16: the values are the same as if the backend had moved int16. A sum or product that
overflows int16 wraps as it would have in int16 arithmetic (the low 16 bits are the same).
"""

from __future__ import annotations

import torch

WIDER_ON_THE_WIRE: dict[torch.dtype, torch.dtype] = {torch.int16: torch.int32}
"""dtype -> the dtype it travels as, for the dtypes gloo and NCCL lack."""


def wire_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a tensor of ``dtype`` is moved in."""
    return WIDER_ON_THE_WIRE.get(dtype, dtype)


def to_wire(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself when the backend moves its dtype, else a contiguous copy in the wider dtype."""
    wide = WIDER_ON_THE_WIRE.get(tensor.dtype)
    return tensor if wide is None else tensor.to(wide, memory_format=torch.contiguous_format)


def from_wire(wire: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``wire`` back in ``dtype`` (itself when nothing was converted)."""
    return wire if wire.dtype == dtype else wire.to(dtype)
