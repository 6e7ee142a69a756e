"""``python -m benchmarks.lighthouse_scale``: simulated replica groups against the real lighthouse form a
quorum and see a dead one left out by its heartbeat timeout (never how fast)."""

from __future__ import annotations

import json

import pytest
from benchmark_command import run_benchmark

from benchmarks import lighthouse_scale
from shoal.errors import ShoalError


def test_the_lighthouse_runs_with_shoals_command_and_the_values_asked():
    shoal_own = lighthouse_scale.LighthouseScaleConfig().settings()
    assert shoal_own == {
        "heartbeat_timeout_ms": lighthouse_scale.HEARTBEAT_TIMEOUT_MS,
        "join_timeout_ms": lighthouse_scale.JOIN_TIMEOUT_MS,
        "quorum_tick_ms": lighthouse_scale.QUORUM_TICK_MS,
    }
    argv = lighthouse_scale.lighthouse_command(4321, {**shoal_own, "heartbeat_timeout_ms": 3000})
    assert argv[argv.index("--bind") + 1] == "127.0.0.1:4321"
    assert argv[argv.index("--heartbeat_timeout_ms") + 1] == "3000"
    assert argv[argv.index("--quorum_tick_ms") + 1] == str(lighthouse_scale.QUORUM_TICK_MS)


def test_each_size_runs_with_shoals_heartbeats_for_it_unless_asked_otherwise():
    by_size = lighthouse_scale.LighthouseScaleConfig()
    small, interval = by_size.settings_for(256)
    assert small == by_size.settings() and interval == 100
    large, interval = by_size.settings_for(1000)
    assert large["heartbeat_timeout_ms"] == 10000 and interval == 500
    asked = lighthouse_scale.LighthouseScaleConfig(heartbeat_timeout_ms=5000, heartbeat_interval_ms=200)
    assert asked.settings_for(1000)[0]["heartbeat_timeout_ms"] == 5000 and asked.settings_for(1000)[1] == 200


def test_bad_sizes_are_clean_errors():
    with pytest.raises(ShoalError, match="--groups must be 2 or more"):
        lighthouse_scale.LighthouseScaleConfig(groups=(1, 8))
    with pytest.raises(ShoalError, match="--steps must be 4 or more"):
        lighthouse_scale.LighthouseScaleConfig(steps=2)


@pytest.mark.multiprocess
def test_smoke_forms_a_quorum_of_four_and_leaves_the_dead_one_out(tmp_path):
    pytest.importorskip("torchft")
    out = tmp_path / "lighthouse.json"
    proc = run_benchmark("lighthouse_scale", "--smoke", "--json", str(out), timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-2000:]
    report = json.loads(out.read_text())
    assert report["benchmark"] == "lighthouse_scale" and report["config"]["smoke"] is True
    (row,) = report["rows"]
    assert row["groups"] == 4 and row["failed"] == 0 and row["left_out"] == 0, row
    # Every step before the death had one quorum of all 4; the step of the death one of the 3 survivors.
    assert row["first_quorum_s"] >= 0 and len(row["step_quorum_runs"]) == 1
    # The dead group is left out by its heartbeat timeout, not at once: its last heartbeat was one
    # interval (100 ms) before it died, or a little more on a loaded machine.
    timeout_s = report["config"]["heartbeat_timeout_ms"] / 1000
    assert timeout_s / 2 <= row["dead_out_s"] < 30, row
    assert row["quorum_ids"] == 2  # the 4 groups' quorum, then the survivors'
    assert row["peak_rss_mib"] > 0 and row["cpu_s_per_step"] >= 0
    assert "first quorum" in proc.stdout
