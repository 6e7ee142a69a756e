"""``shoal.distributed.comm_hooks``: torch's compression hooks by name, on a real (1-rank gloo) DDP model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from shoal.distributed.comm_hooks import COMM_HOOKS, register_comm_hook
from shoal.errors import ShoalError


def test_unknown_name_is_a_shoal_error():
    with pytest.raises(ShoalError) as info:
        register_comm_hook(nn.Linear(2, 2), "int8")
    assert "unknown communication hook 'int8'" in info.value.message
    assert all(name in info.value.hint for name in COMM_HOOKS)


@pytest.mark.parametrize("name", COMM_HOOKS)
def test_a_model_without_ddp_is_left_alone(name):
    model = nn.Linear(2, 2)
    hook = register_comm_hook(model, name)
    assert not hook.applied and not hasattr(model, "_comm_hooks")


@pytest.fixture
def gloo_group(tmp_path: Path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("name, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_hook_compresses_gradients_over_gloo(gloo_group, name, dtype):
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    plain = nn.Linear(16, 4)
    reference = nn.Linear(16, 4)
    reference.load_state_dict(plain.state_dict())
    model = DistributedDataParallel(plain)
    hook = register_comm_hook(model, name)
    assert hook.applied and hook.description == f"gradients all-reduced in {str(dtype).split('.')[1]}"
    assert hook.state_dict() == {}
    x = torch.randn(8, 16)
    model(x).pow(2).sum().backward()
    reference(x).pow(2).sum().backward()
    # The all-reduced gradient went through the wire in `dtype`: it equals the rounded reference.
    expected = reference.weight.grad.to(dtype).float()
    assert torch.equal(plain.weight.grad, expected)
    assert not torch.equal(plain.weight.grad, reference.weight.grad)
    with pytest.raises(RuntimeError):
        register_comm_hook(model, name)  # DDP takes one hook per model
