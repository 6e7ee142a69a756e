"""``hvd.Compression``: what a gradient bucket looks like on the wire.

A compressor has two static methods, as in Horovod: ``compress(tensor) -> (wire, context)`` and
``decompress(wire, context) -> tensor``. ``DistributedOptimizer`` applies them to a whole bucket
(one flat buffer), not to each gradient: ``fp16`` casts the bucket to float16 for the all-reduce
and the sum back to the gradients' dtype, halving the bytes sent. User-written compressors with
the same two methods work too.
"""

from __future__ import annotations

from typing import Any

import torch

from shoal.horovod.errors import HorovodUsageError


class Compressor:
    """The interface: subclasses override both static methods."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """The tensor as it is (the default)."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16 and come back in their own dtype; others unchanged."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor if ctx is None else tensor.to(ctx)


class Compression:
    """The compressors by name: ``Compression.none`` (default) and ``Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor


def check_compressor(compression: Any) -> Any:
    """``compression`` if it has ``compress`` and ``decompress``; else a HorovodUsageError."""
    if callable(getattr(compression, "compress", None)) and callable(getattr(compression, "decompress", None)):
        return compression
    raise HorovodUsageError(
        f"compression={compression!r} is not a compressor (it needs compress and decompress)",
        "pass hvd.Compression.none or hvd.Compression.fp16",
    )
