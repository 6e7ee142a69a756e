"""``shoal train`` across two nodes (two network namespaces), 2 workers each, real gloo."""

from __future__ import annotations

import json

import pytest
import torch

from cluster.helpers import describe, shoal_on, wait_all
from conftest import run_shoal

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
    extra = json.loads((out / "config.json").read_text())["extra"]
    assert (extra["world_size"], extra["num_nodes"], extra["global_batch_size"]) == (4, 2, 128), extra
    assert metrics[0]["samples_seen"] == 1440  # every training image once, over both nodes
    # The same job on one node (4 workers, same seed and global batch) ends on the same weights: two
    # nodes change where the ranks run, not what they compute (up to the all-reduce's summation order).
    one_node = run_shoal(
        "train", "digits", "--epochs", "1", "--nproc", "4", "--device", "cpu", "--out", str(tmp_path / "one"),
        timeout=300,
    )  # fmt: skip
    assert one_node.returncode == 0, one_node.stderr
    two, one = (torch.load(d / "model.pt", weights_only=True) for d in (out, tmp_path / "one"))
    assert two.keys() == one.keys()
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=0, atol=1e-5)
    for node, item in zip((a, b), launched):
        assert f"shoal: network: advertising {node.addr} on {node.ifname}" in item.output, describe(launched)
        assert "waiting for the c10d rendezvous at 10.77.0.1:29400 (join timeout 120 s)" in item.output
