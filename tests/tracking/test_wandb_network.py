"""W&B without a key or without a network: the job completes, offline, and says how to sync.

The job runs in a network namespace of its own (``unshare --net``) that has only a loopback
interface, so nothing beyond loopback is reachable, and ``WANDB_BASE_URL`` points at a loopback
listener inside it that counts the connections it gets.
"""

from __future__ import annotations

import shutil

import pytest

from tracking.harness import run_job
from tracking.readers import wandb_runs
from tracking.scripts.tracked_job import expected_loss

LAST = 6
NO_NETWORK = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "no-network"]

pytestmark = pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")


def _plan(tmp_path) -> dict:
    return {
        "spec": "wandb",
        "run_dir": str(tmp_path / "run"),
        "first_step": 1,
        "last_step": LAST,
        "epoch_steps": 3,
        "listen": True,  # WANDB_BASE_URL -> a loopback listener that counts connections
        "init_timeout": 5,
    }


def test_without_an_api_key_wandb_never_touches_the_network(tmp_path, tool_env):
    proc, results = run_job(_plan(tmp_path), tmp_path / "results", tool_env, prefix=NO_NETWORK)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert results[0]["connections"] == 0
    wandb_dir = tmp_path / "run" / "wandb"
    lines = [line for line in proc.stderr.splitlines() if line.startswith("shoal: tracker wandb:")]
    assert lines == [
        f"shoal: tracker wandb: no W&B API key configured: logging offline; upload later with: wandb sync {wandb_dir}"
    ]
    (run,) = wandb_runs(tmp_path / "run", tool_env)
    assert run.series("train/loss") == pytest.approx({s: expected_loss(s, 1) for s in range(1, LAST + 1)})


def test_with_a_key_but_no_server_it_falls_back_to_offline(tmp_path, tool_env):
    env = {**tool_env, "WANDB_API_KEY": "k" * 40}
    proc, results = run_job(_plan(tmp_path), tmp_path / "results", env, prefix=NO_NETWORK)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert results[0]["connections"] > 0  # it did try the (unanswering) server first
    lines = [line for line in proc.stderr.splitlines() if line.startswith("shoal: tracker wandb:")]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("shoal: tracker wandb: could not open an online run (")
    assert lines[0].endswith(f"logging offline; upload later with: wandb sync {tmp_path / 'run' / 'wandb'}")
    (run,) = wandb_runs(tmp_path / "run", tool_env)
    assert run.run_id == results[0]["state"]["trackers"]["wandb"]["run_id"]
    assert run.series("train/loss") == pytest.approx({s: expected_loss(s, 1) for s in range(1, LAST + 1)})
