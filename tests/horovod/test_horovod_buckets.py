"""The pieces of the gradient path that need no process group: bucket planning, packing, compression."""

from __future__ import annotations

import os
from unittest import mock

import pytest
import torch

from shoal.horovod import buckets
from shoal.horovod.compression import Compression, check_compressor
from shoal.horovod.errors import HorovodUsageError

KIB = 1024


def _floats(*counts: int, dtype=torch.float32) -> list[torch.Tensor]:
    return [torch.zeros(count, dtype=dtype) for count in counts]


def test_buckets_close_at_the_cap_and_the_first_is_small():
    tensors = _floats(64, 64, 64, 512, 512, 512)  # 256 B, 256 B, 256 B, 2 KiB x 3
    assert buckets.plan_buckets(tensors, first_cap=512, cap=4 * KIB) == [[0, 1], [2, 3, 4], [5]]


def test_each_bucket_holds_one_dtype_and_keeps_the_order_of_its_first_tensor():
    tensors = [*_floats(8), *_floats(8, dtype=torch.float64), *_floats(8), *_floats(8, dtype=torch.float64)]
    assert buckets.plan_buckets(tensors, first_cap=KIB, cap=KIB) == [[0, 2], [1, 3]]


def test_a_tensor_over_the_cap_gets_a_bucket_of_its_own():
    tensors = _floats(4, 10_000, 4)
    assert buckets.plan_buckets(tensors, first_cap=KIB, cap=KIB) == [[0, 1], [2]]


def test_fusion_threshold_sets_the_cap_and_zero_means_no_fusion():
    with mock.patch.dict(os.environ, {"HOROVOD_FUSION_THRESHOLD": "0"}):
        first, cap = buckets.bucket_caps()
        assert buckets.plan_buckets(_floats(1, 1, 1), first, cap) == [[0], [1], [2]]
    with mock.patch.dict(os.environ, {"HOROVOD_FUSION_THRESHOLD": str(64 * 1024 * 1024)}):
        assert buckets.bucket_caps() == (buckets.FIRST_BUCKET_BYTES, 64 * 1024 * 1024)
    bad = pytest.raises(HorovodUsageError, match="HOROVOD_FUSION_THRESHOLD='64MB' is not a number of bytes")
    with mock.patch.dict(os.environ, {"HOROVOD_FUSION_THRESHOLD": "64MB"}), bad:
        buckets.bucket_caps()


def test_pack_and_unpack_round_trip_through_one_flat_buffer():
    tensors = [torch.arange(6.0).reshape(2, 3), torch.arange(4.0).reshape(2, 2).t(), torch.tensor(7.0)]
    flat = torch.empty(buckets.total_numel(tensors) + 1)
    buckets.pack(tensors, flat)
    assert flat[:11].tolist() == [0, 1, 2, 3, 4, 5, 0, 2, 1, 3, 7]
    targets = [torch.empty_like(t) for t in tensors]
    buckets.unpack(flat, targets)
    assert all(torch.equal(a, b) for a, b in zip(tensors, targets))


def test_fp16_travels_as_half_and_comes_back_in_its_dtype():
    grads = torch.tensor([1.0, 1e-4, 3.14159], dtype=torch.float32)
    wire, context = Compression.fp16.compress(grads)
    assert wire.dtype == torch.float16
    back = Compression.fp16.decompress(wire, context)
    assert back.dtype == torch.float32 and not torch.equal(back, grads) and torch.allclose(back, grads, rtol=1e-3)
    ints = torch.tensor([3])
    assert Compression.fp16.decompress(*Compression.fp16.compress(ints)) is ints
    assert Compression.none.compress(grads)[0] is grads
    with pytest.raises(HorovodUsageError, match="is not a compressor"):
        check_compressor("fp16")
