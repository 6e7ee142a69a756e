"""``shoal train --comm-hook powersgd``: PowerSGD's state is in every checkpoint, and a run resumed from a
mid-run checkpoint ends bit-identical to the uninterrupted one (2 workers, gloo, real processes).

The negative control removes the hook's state from the same checkpoint: that resume must end with
other weights, or the first test would prove nothing.
"""

from __future__ import annotations

import pytest
import torch

from conftest import run_shoal
from procs import checkpoints

pytestmark = pytest.mark.multiprocess

# 3 epochs of digits on 2 workers, 23 steps each: PowerSGD after powersgd_start(69) = 6 steps.
RUN = ["train", "digits", "--device", "cpu", "--nproc", "2", "--epochs", "3", "--seed", "3", "--comm-hook", "powersgd"]
RUN += ["--powersgd-rank", "1", "--checkpoint-every", "7steps", "--keep", "20", "--no-progress"]


def _weights(out):
    return torch.load(out / "model.pt", weights_only=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("powersgd") / "reference"
    result = run_shoal(*RUN, "--out", str(out), timeout=300)
    assert result.returncode == 0, result.stderr
    assert "comm hook powersgd: rank-1 PowerSGD with error feedback after 6 steps of plain float32 all-reduce" in (
        result.stdout
    )
    return out


def _mid_run_checkpoint(reference):
    """The checkpoint after step 28: mid epoch 2, long after PowerSGD started."""
    (path,) = [p for p in checkpoints(reference / "checkpoints") if p.name.endswith("-s000000028.pt")]
    return path


def test_checkpoints_hold_every_ranks_powersgd_state(reference):
    payload = torch.load(_mid_run_checkpoint(reference), weights_only=True)
    states = [rank["objects"]["comm_hook"] for rank in payload["ranks"]]
    assert len(states) == 2
    model = _weights(reference)
    for state in states:
        assert state["rank"] == 1 and state["iter"] == 28
        # One piece per parameter: its error feedback; P and Q for the three weight matrices.
        assert sorted(state["params"]) == list(range(len(model)))
        assert [sorted(piece) for piece in state["params"].values()] == [["error", "p", "q"], ["error"]] * 3
    # Error feedback is each rank's own: the two ranks saw different data.
    assert not torch.equal(states[0]["params"][0]["error"], states[1]["params"][0]["error"])


def test_resumed_from_mid_run_checkpoint_is_bit_identical(reference, tmp_path):
    source = _mid_run_checkpoint(reference)
    out = tmp_path / "resumed"
    result = run_shoal(*RUN, "--out", str(out), "--resume", str(source), timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"resuming from {source}: epoch 2, step 28" in result.stdout
    expected, got = _weights(reference), _weights(out)
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), key


def test_without_the_hook_state_the_resume_ends_elsewhere(reference, tmp_path):
    payload = torch.load(_mid_run_checkpoint(reference), weights_only=True)
    for rank in payload["ranks"]:
        del rank["objects"]["comm_hook"]
    stripped = tmp_path / "ckpt-e00002-s000000028.pt"
    torch.save(payload, stripped)
    out = tmp_path / "stripped"
    result = run_shoal(*RUN, "--out", str(out), "--resume", str(stripped), timeout=300)
    assert result.returncode == 0, result.stderr
    expected, got = _weights(reference), _weights(out)
    assert any(not torch.equal(expected[key], got[key]) for key in expected)
