"""Two real processes in a gloo group: the loaders' shards cover every sample exactly once per epoch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("_mp_loader_worker.py")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.multiprocess
def test_two_processes_cover_every_sample_once_per_epoch(tmp_path):
    world, port, out = 2, free_port(), tmp_path / "gathered.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only: do not resolve the hostname
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(rank), str(world), str(port), str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(world)
    ]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=120)[0])
    finally:
        for p in procs:  # never leave a worker behind, even when the other one failed
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0] * world, "\n".join(logs)

    result = json.loads(out.read_text())
    n, seed = result["n"], result["seed"]
    for kind, ranks in result["ranks"].items():
        assert len(ranks) == world
        for e in range(2):
            per_rank = [r[e]["indices"] for r in ranks]
            assert {r[e]["epoch"] for r in ranks} == {e}, kind
            assert len({len(p) for p in per_rank}) == 1, f"{kind}: ranks must take equal step counts"
            flat = [i for p in per_rank for i in p]
            order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + e)).tolist()
            padding = -n % world
            assert Counter(flat) == Counter(order + order[:padding]), kind
            assert {str(r[e]["state"]) for r in ranks} == {str(ranks[0][e]["state"])}
            assert ranks[0][e]["state"]["consumed"] == n
    # Both paths hand out the same samples on the same rank.
    assert [r[e]["indices"] for r in result["ranks"]["tensor"] for e in range(2)] == [
        r[e]["indices"] for r in result["ranks"]["dataloader"] for e in range(2)
    ]
