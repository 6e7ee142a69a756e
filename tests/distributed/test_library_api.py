"""The library API (shoal.init, ctx.wrap/loader/evaluate, helpers) in one process and under torchrun."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
from torch import nn

import shoal
import warm
from shoal.distributed.wrap import clean_state_dict, unwrap_model

SCRIPT = Path(__file__).parent / "scripts" / "library_user.py"


def _check_run(result: dict, world_size: int) -> None:
    assert result["world_size"] == world_size
    for epoch in range(2):
        indices = sorted(i for rank_seen in result["seen"] for i in rank_seen[epoch])
        padded = -(-10 // world_size) * world_size
        assert len(indices) == padded and set(indices) == set(range(10))
    orders = [[i for rank_seen in result["seen"] for i in rank_seen[e]] for e in range(2)]
    assert orders[0] != orders[1]  # reshuffled each epoch without set_epoch
    assert result["scores"]["samples"] == 11  # nothing counted twice, nothing missed
    assert result["scores"]["accuracy"] == pytest.approx(6 / 11)
    assert result["mean"] == {"rank": pytest.approx((world_size - 1) / 2), "one": 1.0}
    assert result["clean_keys"] == ["bias", "weight"]


def test_single_process(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SHOAL_ENV")}
    out = tmp_path / "result.json"
    warm.run([sys.executable, str(SCRIPT), str(out)], script=True, check=True, env=env, timeout=120)
    result = json.loads(out.read_text())
    _check_run(result, 1)
    assert result["scheme"] == "local" and result["wrapped"] == "Linear"


@pytest.mark.multiprocess
def test_three_processes_under_torchrun(tmp_path):
    out = tmp_path / "result.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "3",
        str(SCRIPT),
        str(out),
    ]
    proc = warm.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    _check_run(result, 3)
    assert result["scheme"] == "torchrun" and result["wrapped"] == "DistributedDataParallel"
    assert proc.stdout.count("hello from the main process") == 1


def test_init_is_idempotent_and_shuts_down():
    with mock.patch.dict(os.environ, {}, clear=False):
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SHOAL_ENV", "TORCHELASTIC_RUN_ID"):
            os.environ.pop(name, None)
        with shoal.init(device="cpu", threads=1) as ctx:
            assert shoal.init() is ctx and shoal.current() is ctx
            assert (ctx.rank, ctx.world_size, ctx.is_main, ctx.backend) == (0, 1, True, "gloo")
            assert ctx.device == torch.device("cpu")
        assert shoal.current() is None


def test_clean_state_dict_and_unwrap():
    model = nn.Linear(2, 2)
    with mock.patch.dict(os.environ):  # torch.compile sets TORCHINDUCTOR_CACHE_DIR
        compiled = torch.compile(model)
    assert unwrap_model(compiled) is model
    state = {"module._orig_mod.weight": 1, "module.bias": 2, "plain": 3}
    assert clean_state_dict(state) == {"weight": 1, "bias": 2, "plain": 3}
    assert list(shoal.model_state_dict(compiled)) == ["weight", "bias"]
