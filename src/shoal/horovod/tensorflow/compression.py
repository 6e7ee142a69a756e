"""``hvd.Compression`` for TensorFlow tensors (Horovod's ``horovod/tensorflow/compression.py``).

The same two static methods as the torch side, on TF tensors: ``fp16`` casts floating-point
tensors to float16 before they cross (half the bytes) and back after. Being TF ops, the casts also
run inside ``tf.function`` and ``model.fit``; user compressors with the same methods work too.
"""

from __future__ import annotations

from typing import Any

from shoal.horovod.compression import Compressor
from shoal.horovod.tensorflow.framework import tf


class NoneCompressor(Compressor):
    """The tensor as it is (the default)."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16 and come back in their own dtype; others unchanged."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        if tensor.dtype.is_floating and tensor.dtype != tf.float16:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor if ctx is None else tf.cast(tensor, ctx)


class Compression:
    """The compressors by name: ``Compression.none`` (default) and ``Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
