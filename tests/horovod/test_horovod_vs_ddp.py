"""shoal.horovod's DistributedOptimizer against DistributedDataParallel: the same job, the same weights.

scripts/hvd_vs_ddp.py trains one seeded MLP on the same per-rank batches under torchrun (2 gloo
processes), through ``hvd.DistributedOptimizer`` and through DDP with each option below, one run
after the other in one job (a job per run cost 3 interpreters each: 24 in all). With 2 ranks, dividing
by the world size before the sum (DDP) or after it (Horovod's Average) is exact in binary floating
point, so the weights must agree bit for bit; the comparisons allow float tolerance all the same,
since the claim is "equal within float tolerance" for any world size.
"""

from __future__ import annotations

import pytest
import torch
from horovod_launch import VS_DDP, check, run

pytestmark = pytest.mark.multiprocess


RUNS = ["ddp", "hvd", "hvd,passes=2", "ddp,passes=2", "hvd,predivide=4", "hvd,sum", "ddp,lr=0.1", "hvd,fp16"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, dict]:
    """Every run of :data:`RUNS`, one after the other in one torchrun job of 2 ranks."""
    out = tmp_path_factory.mktemp("hvd_vs_ddp") / "runs.pt"
    check(run("torchrun", 2, VS_DDP, str(out), *RUNS))
    return torch.load(out, weights_only=True)


def _largest_difference(a: dict, b: dict) -> float:
    assert a["state"].keys() == b["state"].keys()
    return max((a["state"][k] - b["state"][k]).abs().max().item() for k in a["state"])


def test_average_matches_ddp(trained):
    ddp = trained["ddp"]
    assert _largest_difference(trained["hvd"], ddp) <= 1e-6
    moved = max((ddp["state"][k] - ddp["initial"][k]).abs().max().item() for k in ddp["state"])
    assert moved > 1e-2  # the weights moved: the agreement is not between two untouched models


def test_backward_passes_per_step_matches_ddp_no_sync(trained):
    assert _largest_difference(trained["hvd,passes=2"], trained["ddp,passes=2"]) <= 1e-6
    assert _largest_difference(trained["ddp,passes=2"], trained["ddp"]) > 1e-3  # not the one-pass run


def test_predivide_factor_keeps_the_average(trained):
    assert _largest_difference(trained["hvd,predivide=4"], trained["ddp"]) <= 1e-6


def test_sum_is_the_average_times_size(trained):
    """op=Sum doubles every gradient on 2 ranks: the same run as Average at twice the learning rate."""
    assert _largest_difference(trained["hvd,sum"], trained["ddp"]) > 1e-3
    assert _largest_difference(trained["hvd,sum"], trained["ddp,lr=0.1"]) <= 1e-6


def test_fp16_compression_rounds_the_wire_only(trained):
    difference = _largest_difference(trained["hvd,fp16"], trained["ddp"])
    assert 0 < difference <= 1e-3  # float16 rounding of the summed gradients, nothing more
