"""shoal.horovod's DistributedOptimizer against DistributedDataParallel: the same job, the same weights.

scripts/hvd_vs_ddp.py trains one seeded MLP on the same per-rank batches under torchrun (2 gloo
processes), once through ``hvd.DistributedOptimizer`` and once through DDP. With 2 ranks, dividing
by the world size before the sum (DDP) or after it (Horovod's Average) is exact in binary floating
point, so the weights must agree bit for bit; the comparisons allow float tolerance all the same,
since the claim is "equal within float tolerance" for any world size.
"""

from __future__ import annotations

import pytest
import torch
from horovod_launch import VS_DDP, check, run

pytestmark = pytest.mark.multiprocess


def _train(tmp_path, mode: str, *options: str) -> dict:
    out = tmp_path / f"{mode}{''.join(options).replace('-', '_')}.pt"
    check(run("torchrun", 2, VS_DDP, mode, str(out), *options))
    return torch.load(out, weights_only=True)


def _largest_difference(a: dict, b: dict) -> float:
    assert a["state"].keys() == b["state"].keys()
    return max((a["state"][k] - b["state"][k]).abs().max().item() for k in a["state"])


@pytest.fixture(scope="module")
def ddp(tmp_path_factory) -> dict:
    return _train(tmp_path_factory.mktemp("ddp"), "ddp")


def test_average_matches_ddp(ddp, tmp_path):
    hvd = _train(tmp_path, "hvd")
    assert _largest_difference(hvd, ddp) <= 1e-6
    trained = max((ddp["state"][k] - ddp["initial"][k]).abs().max().item() for k in ddp["state"])
    assert trained > 1e-2  # the weights moved: the agreement is not between two untouched models


def test_backward_passes_per_step_matches_ddp_no_sync(tmp_path):
    hvd = _train(tmp_path, "hvd", "--passes", "2")
    ddp = _train(tmp_path, "ddp", "--passes", "2")
    assert _largest_difference(hvd, ddp) <= 1e-6


def test_predivide_factor_keeps_the_average(ddp, tmp_path):
    assert _largest_difference(_train(tmp_path, "hvd", "--predivide", "4"), ddp) <= 1e-6


def test_sum_is_the_average_times_size(ddp, tmp_path):
    """op=Sum doubles every gradient on 2 ranks: the same run as Average at twice the learning rate."""
    summed = _train(tmp_path, "hvd", "--sum")
    assert _largest_difference(summed, ddp) > 1e-3
    ddp_double_lr = _train(tmp_path, "ddp", "--lr", "0.1")
    assert _largest_difference(summed, ddp_double_lr) <= 1e-6


def test_fp16_compression_rounds_the_wire_only(ddp, tmp_path):
    compressed = _train(tmp_path, "hvd", "--fp16")
    difference = _largest_difference(compressed, ddp)
    assert 0 < difference <= 1e-3  # float16 rounding of the summed gradients, nothing more
