"""``register_comm_hook(model, "powersgd", rank=...)``: torch's PowerSGD with its state surviving a checkpoint.

The multi-process test runs tests/distributed/scripts/powersgd_resume.py under torchrun (2 ranks,
gloo): a model larger than one DDP bucket trains 6 steps, its PowerSGD state goes through a
checkpoint file (``weights_only`` load), and a fresh DDP model resumes from it. A fresh DDP model
holds every parameter in one bucket for its first step and re-buckets afterwards, so the resumed
run meets another bucket layout than the run that saved the state: the test checks that it still
ends bit-identical, and that resuming without the state does not.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from torch import nn

import warm
from shoal.distributed.comm_hooks import (
    COMM_HOOKS,
    CommHook,
    powersgd_start,
    register_comm_hook,
)
from shoal.distributed.comm_hooks.powersgd import powersgd_sizes
from shoal.errors import ShoalError

SCRIPT = Path(__file__).parent / "scripts" / "powersgd_resume.py"


@pytest.mark.multiprocess
def test_state_survives_a_checkpoint_bit_identical_across_a_bucket_layout_change(tmp_path):
    out = tmp_path / "result.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(SCRIPT),
        str(out),
    ]
    proc = warm.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["world_size"] == 2
    # The layouts: two buckets when saved; one bucket of everything in the resumed first step; two again.
    assert result["buckets_before"] == 2
    assert result["first_step_after_resume"] == [[0, 1, 2, 3, 4, 5]]
    assert len(result["buckets_after_resume"]) == 2
    # What was saved: the iteration, every parameter's error feedback, P and Q for the three matrices.
    assert result["saved_iter"] == 6 and result["iter_after"] == 8
    assert result["saved_params"] == [0, 1, 2, 3, 4, 5]
    assert result["saved_pieces"] == {
        "0": ["error", "p", "q"],
        "1": ["error"],
        "2": ["error", "p", "q"],
        "3": ["error"],
        "4": ["error", "p", "q"],
        "5": ["error"],
    }
    assert result["identical"] is True and result["max_diff"] == 0.0
    # The state matters: the same resume from fresh memories ends elsewhere.
    assert result["identical_without_state"] is False and result["max_diff_without_state"] > 1e-4


def test_bad_arguments_are_shoal_errors():
    with pytest.raises(ShoalError, match="--powersgd-rank must be at least 1") as err:
        register_comm_hook(nn.Linear(2, 2), "powersgd", rank=0)
    assert err.value.hint
    with pytest.raises(ShoalError, match="cannot start before step 2") as err:
        register_comm_hook(nn.Linear(2, 2), "powersgd", start_iter=1)
    assert "re-buckets" in err.value.hint


@pytest.mark.parametrize("name", COMM_HOOKS)
def test_without_ddp_nothing_is_registered_and_nothing_saved(name):
    hook = register_comm_hook(nn.Linear(2, 2), name)
    assert isinstance(hook, CommHook) and hook.name == name and not hook.applied
    assert hook.state_dict() == {}
    hook.load_state_dict({"iter": 5})  # another hook's state: ignored


def test_start_is_ten_percent_of_the_run_and_at_least_two():
    assert powersgd_start(1876) == 187
    assert powersgd_start(10) == 2 and powersgd_start(0) == 2


def test_sizes_follow_torchs_rules():
    """What a step sends: a 2048x1728 matrix as P (2048 x 2) and Q (1728 x 2); vectors as they are;
    a 10x2048 matrix at rank 2 is still worth compressing ((10 + 2048) x 2 x 2 < 20480)."""
    shapes = [(2048, 1728), (2048,), (10, 2048), (10,)]
    plain, compressed = powersgd_sizes(shapes, rank=2)
    assert plain == 2048 * 1728 + 2048 + 10 * 2048 + 10
    assert compressed == (2048 + 1728) * 2 + 2048 + (10 + 2048) * 2 + 10
    # A conv weight is viewed as out x (in x kh x kw); rank is capped by the smaller side.
    assert powersgd_sizes([(64, 3, 7, 7)], rank=4) == (64 * 147, (64 + 147) * 4)
    assert powersgd_sizes([(3, 3)], rank=4) == (9, 9)  # (3 + 3) x 3 x 2 > 9: sent as it is
