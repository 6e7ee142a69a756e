"""shoal.horovod on GPUs: NCCL for the gradients, a gloo group beside it for CPU tensors (metrics, objects).

Skipped without CUDA. On a GPU node the tutorial pins each rank to its local GPU, its buckets
travel over NCCL, and its metric all-reduces (CPU tensors) over the gloo group shoal.horovod opens.
"""

from __future__ import annotations

import pytest
import torch
from horovod_launch import API, COLLECTIVES, TUTORIAL, check, results, run
from test_horovod_collectives import _check as check_collectives

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.multiprocess,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _ranks() -> int:
    return min(2, torch.cuda.device_count())


def test_tutorial_trains_on_gpus_over_nccl(tmp_path):
    n = _ranks()
    check(run("torchrun", n, TUTORIAL, "--out", str(tmp_path), "--epochs", "2"))
    ranks = results(tmp_path, n)
    assert [r["device"] for r in ranks] == [f"cuda:{rank}" for rank in range(n)]
    if n > 1:
        assert {r["backend"] for r in ranks} == {"nccl"}
    assert len({r["weights"] for r in ranks}) == 1
    assert ranks[0]["accuracies"][-1] > 0.8


def test_cpu_tensor_collectives_beside_nccl(tmp_path):
    n = _ranks()
    check(run("torchrun", n, API, str(tmp_path)))
    for seen in results(tmp_path, n):
        assert seen["allreduce"]["sum"] == pytest.approx([n * (n + 1) / 2, 10 * n * (n + 1) / 2])
        assert seen["join_last"] == n - 1


def test_every_collective_and_dtype_on_gpus(tmp_path):
    """The collectives script with its inputs on each rank's GPU: NCCL moves them (int16 as int32)."""
    n = _ranks()
    check(run("torchrun", n, COLLECTIVES, str(tmp_path), "cuda"))
    check_collectives(results(tmp_path, n), n)
