"""``ctx.evaluate`` of an FSDP model: exact over ranks holding different numbers of batches, one
line + HINT where a rank holds none (an FSDP forward is collective: a rank that stopped early would
leave the others waiting in an all-gather)."""

import json
import subprocess
from pathlib import Path

import pytest

from conftest import run_shoal

SCRIPT = Path(__file__).parent / "scripts" / "fsdp_evaluate.py"


def _run(samples: int, out: Path) -> subprocess.CompletedProcess:
    # ``shoal run`` started warm (tests/warm.py); the two workers it launches start for real.
    return run_shoal("run", "--nproc", "2", str(SCRIPT), str(samples), str(out), timeout=180)


@pytest.mark.multiprocess
def test_uneven_batches_evaluate_exactly_and_a_rank_without_one_is_named(tmp_path):
    out = tmp_path / "result.json"
    done = _run(3, out)  # rank 0 holds 2 samples, rank 1 holds 1
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(out.read_text())
    assert found["batches"] == 2 and found["result"]["samples"] == 3
    assert found["result"]["loss"] == pytest.approx(found["expected"]["loss"], rel=1e-6)
    assert found["result"]["accuracy"] == pytest.approx(found["expected"]["accuracy"])

    refused = _run(1, tmp_path / "none.json")  # rank 1 holds no sample
    assert refused.returncode != 0
    assert "some rank has no evaluation batch while another has 1" in refused.stdout + refused.stderr
    assert not (tmp_path / "none.json").exists()
