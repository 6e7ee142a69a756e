"""FSDP2 sharding (shoal.distributed.fsdp): blocks, FSDP vs DDP from one seed, model.pt, bad inputs.

The multi-process test runs tests/distributed/scripts/fsdp_vs_ddp.py under torchrun (2 gloo ranks).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn

import warm
from shoal.distributed.fsdp import DEFAULT_MIN_BLOCK_PARAMS, apply_fsdp, find_blocks
from shoal.distributed.strategy import check_strategy, refuse_comm_hook_with_fsdp
from shoal.errors import ShoalError
from shoal.workloads.language_model import TinyGPT

SCRIPT = Path(__file__).parent / "scripts" / "fsdp_vs_ddp.py"

LOSS_RTOL = 1e-5
"""FSDP vs DDP loss, relative. Both average the same float32 gradients; only the reduction order
may differ (DDP all-reduces buckets, FSDP reduce-scatters per block), a few ulps (~1e-7) per step that
Adam carries on. With 2 ranks each element is one float32 addition of two values (commutative) and
a division by 2 (exact), so the runs agree bit for bit; the tolerance covers other world sizes."""


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp")
    out, model_path = tmp / "result.json", tmp / "model.pt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    proc = warm.run([*cmd, str(SCRIPT), str(out), str(model_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text()), model_path


@pytest.mark.multiprocess
def test_fsdp_trains_tinygpt_as_ddp_does_from_the_same_seed(two_ranks):
    result, _ = two_ranks
    assert result["world"] == 2 and result["is_fsdp"] and result["blocks"] == 2
    # The head's weight (256 x 32) is sharded: each rank holds half of its rows.
    assert result["head_local_shape"] == [128, 32]
    ddp, fsdp = result["ddp_losses"], result["fsdp_losses"]
    assert len(ddp) == len(fsdp) == 12
    assert fsdp[-1] < fsdp[0] - 1.0  # it learns
    assert fsdp == pytest.approx(ddp, rel=LOSS_RTOL)
    assert result["max_weight_diff"] <= 1e-5
    assert result["fsdp_dtypes"] == ["torch.float32"]


@pytest.mark.multiprocess
def test_model_pt_of_an_fsdp_model_is_a_plain_state_dict(two_ranks):
    result, model_path = two_ranks
    assert result["state_types"] == ["Tensor"]  # no DTensor
    state = torch.load(model_path, map_location="cpu", weights_only=True)
    plain = TinyGPT.preset("tiny")
    assert sorted(state) == sorted(plain.state_dict())  # no prefixes
    plain.load_state_dict(state)  # strict: every key, every shape
    assert all(type(v) is torch.Tensor for v in state.values())
    # And back: a plain full state dict (DDP's) loads into a fresh FSDP model, each rank its slice.
    assert result["reloaded_max_diff"] == 0.0


@pytest.mark.multiprocess
def test_bf16_mixed_precision_on_cpu_computes_in_bf16_keeps_fp32_shards(two_ranks):
    result, _ = two_ranks
    assert result["bf16_dtypes"] == ["torch.bfloat16"]
    assert result["bf16_param_dtypes"] == ["torch.float32"]
    losses, reference = result["bf16_losses"], result["fsdp_losses"]
    assert losses[-1] < losses[0] - 1.0
    # bf16 compute: close to the float32 run (8 mantissa bits), not identical to it.
    assert losses != reference and losses == pytest.approx(reference, abs=0.05)


@pytest.mark.multiprocess
def test_fsdp_trains_a_resnet18_stage_by_stage(two_ranks):
    result, _ = two_ranks
    assert result["resnet_blocks"] == 4
    losses = result["resnet_losses"]
    assert losses[-1] < losses[0] / 4


def test_blocks_of_a_transformer_a_resnet_and_by_size():
    gpt = TinyGPT.preset("tiny")
    assert find_blocks(gpt) == list(gpt.blocks)
    resnet = torchvision.models.resnet18()
    assert find_blocks(resnet) == [resnet.layer1, resnet.layer2, resnet.layer3, resnet.layer4]
    # No known layout: the size rule, bottom-up. Two 100x100 layers (10,100 parameters each) are
    # blocks at a threshold of 10,000; the small ones are left to the root.
    mlp = nn.Sequential(nn.Linear(4, 100), nn.Sequential(nn.Linear(100, 100), nn.Linear(100, 100)), nn.Linear(100, 2))
    assert find_blocks(mlp, min_block_params=10_000) == [mlp[1][0], mlp[1][1]]
    assert find_blocks(mlp, min_block_params=20_000) == [mlp[1]]
    assert find_blocks(mlp) == []  # below the default 1M: only the root is sharded
    assert DEFAULT_MIN_BLOCK_PARAMS == 1_000_000


def test_without_a_process_group_the_model_is_only_moved():
    model = nn.Linear(2, 2)
    assert apply_fsdp(model, device="cpu") is model
    assert type(model) is nn.Linear


def test_unknown_strategy_is_one_line_with_a_hint():
    assert check_strategy("fsdp") == "fsdp" and check_strategy("ddp") == "ddp"
    with pytest.raises(ShoalError, match="unknown strategy 'zero3'") as err:
        check_strategy("zero3")
    assert "--strategy ddp" in err.value.hint and "--strategy fsdp" in err.value.hint


def test_a_model_without_parameters_is_refused():
    with pytest.raises(ShoalError, match=r"\(ReLU\) has no trainable parameters") as err:
        apply_fsdp(nn.ReLU(), device="cpu")
    assert "--strategy ddp" in err.value.hint
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ShoalError, match="no trainable parameters"):
        apply_fsdp(frozen, device="cpu")


@pytest.mark.parametrize("hook", ["bf16", "fp16", "powersgd"])
def test_a_ddp_comm_hook_is_refused_with_fsdp(hook):
    with pytest.raises(ShoalError, match=f"--comm-hook {hook} works only with --strategy ddp") as err:
        refuse_comm_hook_with_fsdp(hook)
    assert "drop --comm-hook" in err.value.hint
    refuse_comm_hook_with_fsdp("none")
    refuse_comm_hook_with_fsdp(None)
    refuse_comm_hook_with_fsdp(hook, strategy="ddp")


def test_bad_mixed_precision_offload_and_threshold_are_refused():
    with pytest.raises(ShoalError, match="mixed precision 'fp16' is not supported") as err:
        apply_fsdp(nn.Linear(2, 2), device="cpu", mixed_precision="fp16")
    assert "bf16" in err.value.hint
    with pytest.raises(ShoalError, match="CPU offload needs an accelerator") as err:
        apply_fsdp(nn.Linear(2, 2), device="cpu", cpu_offload=True)
    assert err.value.hint
    with pytest.raises(ShoalError, match="min_block_params must be at least 1"):
        apply_fsdp(nn.Linear(2, 2), device="cpu", min_block_params=0)


@pytest.mark.gpu
def test_bf16_on_cuda_computes_in_bf16_and_reduces_in_fp32():
    import torch.distributed as dist

    from shoal.distributed.wrap import model_state_dict

    store = dist.HashStore()
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = apply_fsdp(TinyGPT.preset("tiny"), device="cuda", mixed_precision="bf16")
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        x = torch.randint(0, 256, (4, 32), device="cuda")
        losses = []
        for _ in range(10):
            logits = model(x)
            assert logits.dtype == torch.bfloat16
            loss = nn.functional.cross_entropy(logits.float().view(-1, 256), x.view(-1))
            loss.backward()
            assert all(p.grad.dtype == torch.float32 for p in model.parameters())
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        assert losses[-1] < losses[0]
        state = model_state_dict(model)
        assert all(v.device.type == "cpu" and v.dtype == torch.float32 for v in state.values())
    finally:
        dist.destroy_process_group()


def test_wrap_model_chooses_by_strategy_and_refuses_mismatched_options():
    from shoal.distributed.wrap import wrap_model

    cpu = torch.device("cpu")
    model = nn.Linear(2, 2)
    # One process, no process group: either strategy leaves the model as it is.
    assert wrap_model(model, strategy="ddp", device=cpu, world_size=1) is model
    assert wrap_model(model, strategy="fsdp", device=cpu, world_size=1) is model
    with pytest.raises(ShoalError, match="unknown strategy 'zero'"):
        wrap_model(model, strategy="zero", device=cpu, world_size=1)
    with pytest.raises(ShoalError, match="--comm-hook powersgd works only with --strategy ddp"):
        wrap_model(model, strategy="fsdp", device=cpu, world_size=1, comm_hook="powersgd")
    with pytest.raises(ShoalError, match=r"DDP options \(find_unused_parameters\) do not apply"):
        wrap_model(model, strategy="fsdp", device=cpu, world_size=1, find_unused_parameters=True)
    with pytest.raises(ShoalError, match="are FSDP options") as err:
        wrap_model(model, strategy="ddp", device=cpu, world_size=1, mixed_precision="bf16")
    assert "strategy fsdp" in err.value.hint
