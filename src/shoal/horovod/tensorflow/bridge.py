"""TensorFlow tensors to torch and back, by DLPack without a copy where that is safe.

Measured on tensorflow-cpu 2.21 / torch 2.14: an eager TF tensor becomes a torch view of the same
memory through DLPack in about a microsecond. The other way has a hazard: TF accepts a DLPack
capsule of memory that is not 64-byte aligned and then aborts the process in its first kernel
(``Check failed: IsAligned()``), and refuses a non-contiguous one. So a torch tensor crosses to TF
as a view only when it is contiguous, 64-byte aligned and of a dtype both sides share; otherwise
it is copied first (into torch's allocator, which aligns to 64 bytes), never handed over as is.

Views of TF tensors are read-only by contract here: TF may share one buffer between several
tensors (a constant, the two gradients of an ``add``), so the collectives never write into them.
"""

from __future__ import annotations

from typing import Any

import torch

from shoal.horovod.tensorflow.framework import tf

ALIGNMENT = 64
"""Bytes: TF's kernels require this alignment (EIGEN_MAX_ALIGN_BYTES) of every buffer they read."""

_SHARED = {
    tf.float16: torch.float16,
    tf.bfloat16: torch.bfloat16,
    tf.float32: torch.float32,
    tf.float64: torch.float64,
    tf.int8: torch.int8,
    tf.int16: torch.int16,
    tf.int32: torch.int32,
    tf.int64: torch.int64,
    tf.uint8: torch.uint8,
    tf.bool: torch.bool,
}
_TO_TF = {torch_dtype: tf_dtype for tf_dtype, torch_dtype in _SHARED.items()}


def torch_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype of a TF dtype that crosses (ValueError for one that cannot, e.g. string)."""
    try:
        return _SHARED[tf.as_dtype(dtype)]
    except KeyError:
        raise ValueError(f"hvd: TensorFlow dtype {tf.as_dtype(dtype).name} cannot be reduced or exchanged") from None


def to_torch(tensor: Any) -> torch.Tensor:
    """A torch tensor with ``tensor``'s values: a view of its memory (DLPack) when possible, else a copy."""
    if isinstance(tensor, tf.Variable):
        tensor = tensor.read_value()  # a variable's buffer changes under assign: take its value now
    tensor = tf.convert_to_tensor(tensor)
    dtype = torch_dtype(tensor.dtype)
    if tensor.shape.num_elements() == 0:
        return torch.empty(tuple(tensor.shape), dtype=dtype)
    try:
        return torch.from_dlpack(tensor)
    except (RuntimeError, ValueError, TypeError, BufferError):
        return torch.from_numpy(tensor.numpy().copy()).to(dtype)


def can_share(tensor: torch.Tensor) -> bool:
    """True when TF may read ``tensor``'s memory directly (contiguous, aligned, a shared dtype)."""
    return (
        tensor.dtype in _TO_TF
        and tensor.numel() > 0
        and tensor.is_contiguous()
        and tensor.data_ptr() % ALIGNMENT == 0
        and tensor.device.type in ("cpu", "cuda")
    )


def to_tf(tensor: torch.Tensor) -> Any:
    """A TF tensor with ``tensor``'s values: its memory (DLPack) when safe, else an aligned copy.

    The TF tensor keeps the torch memory alive; the caller must not write into ``tensor`` afterwards.
    """
    tensor = tensor.detach()
    if tensor.dtype not in _TO_TF:
        raise ValueError(f"hvd: torch dtype {tensor.dtype} has no TensorFlow equivalent")
    if tensor.numel() == 0:
        return tf.zeros(tuple(tensor.shape), dtype=_TO_TF[tensor.dtype])
    if not can_share(tensor):
        tensor = tensor.clone(memory_format=torch.contiguous_format)  # fresh: torch's allocator aligns
    if not can_share(tensor):  # e.g. an allocator without 64-byte alignment: go through numpy
        return tf.convert_to_tensor(tensor.cpu().numpy())
    return tf.experimental.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(tensor))


def aligned_views(counts: list[int], dtype: torch.dtype, device: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One flat buffer and 1-D slices of it of the given lengths, each slice starting 64-byte aligned.

    Results packed there go back to TF as these slices without a copy (:func:`to_tf`).
    """
    step = max(1, ALIGNMENT // torch.empty((), dtype=dtype).element_size())
    offsets, total = [], 0
    for count in counts:
        offsets.append(total)
        total += -(-count // step) * step
    flat = torch.empty(max(total, 1), dtype=dtype, device=device)
    return flat, [flat[offset : offset + count] for offset, count in zip(offsets, counts)]
