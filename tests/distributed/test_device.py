from __future__ import annotations

import pytest
import torch

from shoal.distributed.device import choose_backend, choose_device
from shoal.errors import ShoalError

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")


@needs_no_cuda
def test_auto_is_cpu_without_cuda():
    assert choose_device("auto", 1, 2) == torch.device("cpu")
    assert choose_backend("auto", torch.device("cpu")) == "gloo"


@needs_no_cuda
def test_cuda_without_cuda_is_a_clear_error():
    with pytest.raises(ShoalError, match="CUDA is not available") as info:
        choose_device("cuda", 0, 1)
    assert "--device cpu" in info.value.hint


def test_nccl_on_cpu_and_unknown_names():
    with pytest.raises(ShoalError, match="nccl"):
        choose_backend("nccl", torch.device("cpu"))
    with pytest.raises(ShoalError, match="unknown device"):
        choose_device("tpu", 0, 1)
    with pytest.raises(ShoalError, match="unknown backend"):
        choose_backend("mpi2", torch.device("cpu"))


@pytest.mark.gpu
def test_auto_picks_the_local_gpu():
    assert choose_device("auto", 0, 1) == torch.device("cuda", 0)
    assert choose_backend("auto", torch.device("cuda", 0)) == "nccl"
    gpus = torch.cuda.device_count()
    for local_rank in range(gpus):  # one GPU per local process, picked by the local rank
        assert choose_device("auto", local_rank, gpus) == choose_device("cuda", local_rank, gpus)
        assert choose_device("auto", local_rank, gpus) == torch.device("cuda", local_rank)
    assert choose_device("auto", 0, gpus + 1) == torch.device("cpu")  # more processes than GPUs
    with pytest.raises(ShoalError, match=f"{gpus + 1} processes on this node but only {gpus} GPU"):
        choose_device("cuda", 0, gpus + 1)
