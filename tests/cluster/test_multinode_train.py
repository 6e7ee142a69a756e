"""``shoal train`` across two nodes (two network namespaces), 2 workers each, real gloo."""

from __future__ import annotations

import json

import pytest

from cluster.helpers import describe, shoal_on, wait_all

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def test_digits_over_c10d_on_two_nodes(two_nodes, tmp_path):
    a, b = two_nodes
    out = tmp_path / "run"  # one directory both "nodes" see, as on a shared filesystem
    args = [
        "train",
        "digits",
        "--epochs",
        "1",
        "--nproc",
        "2",
        "--out",
        str(out),
        "--nnodes",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{a.addr}:29400",
        "--join-timeout",
        "120",
    ]
    launched = [shoal_on(node, args, tmp_path / f"{node.name}.log", cwd=tmp_path) for node in (a, b)]
    wait_all(launched, 300)
    assert [item.returncode for item in launched] == [0, 0], describe(launched)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 1 and metrics[0]["world_size"] == 4
    assert metrics[0]["test_accuracy"] > 0.3  # one epoch of 4 x 32 per step on 8x8 digits
    assert (out / "model.pt").is_file()
    config = json.loads((out / "config.json").read_text())
    assert "4" in json.dumps(config)
    for node, item in zip((a, b), launched):
        assert f"shoal: network: advertising {node.addr} on {node.ifname}" in item.output, describe(launched)
        assert "waiting for the c10d rendezvous at 10.77.0.1:29400 (join timeout 120 s)" in item.output
