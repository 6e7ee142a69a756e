"""``python -m benchmarks.rendezvous_scale``: simulated nodes really meet through a real TCPStore and
real handlers, and their store requests are counted (never how fast)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmark_command import run_benchmark

from benchmarks import rendezvous_scale
from shoal.errors import ShoalError


def test_unknown_variant_is_a_clean_error():
    with pytest.raises(ShoalError, match="unknown rendezvous variant"):
        rendezvous_scale.RendezvousScaleConfig(variants=("shoal_c10d", "etcd"))


def test_cpu_ticks_are_read_after_the_command_name():
    # a thread name with spaces and parentheses must not shift the fields
    stat = "42 (pt tcp (x)) S " + " ".join(str(i) for i in range(1, 20))
    assert rendezvous_scale._ticks(stat) == 11 + 12  # utime and stime, fields 14 and 15


@pytest.mark.multiprocess  # a host process (node 0 and the store) and one process of simulated nodes
def test_smoke_closes_a_rendezvous_of_8_nodes_and_counts_store_requests(tmp_path: Path):
    out = tmp_path / "rdzv.json"
    proc = run_benchmark("rendezvous_scale", "--smoke", "--json", str(out), timeout=240)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    report = json.loads(out.read_text())
    rows = {r["variant"]: r for r in report["rows"]}
    assert set(rows) == {"shoal_c10d", "shoal_static"}
    for row in rows.values():
        assert "error" not in row, row.get("error")
        assert row["nodes"] == 8 and row["closed_s"] > 0 and row["exit_s"] >= 0
        kinds = row["join_ops_by_kind"]
        assert kinds["connect"] == 1  # one store client per node
        assert kinds.get("set", 0) >= 1  # every node wrote its role for the rank assignment
        assert row["join_ops_per_node"] >= 2 and row["join_ops_max"] >= row["join_ops_per_node"]
        assert row["steady_ops_per_node_s"] > 0  # heartbeats / job-ended checks while the workers run
    # c10d: every node added itself to the shared state with a compare-and-set, and read it back
    assert rows["shoal_c10d"]["join_ops_by_kind"]["compare_set"] >= 1
    assert rows["shoal_c10d"]["join_ops_by_kind"]["get"] >= 1
    assert Path(report["plot"]).is_file() or any("matplotlib" in n for n in report["notes"])
