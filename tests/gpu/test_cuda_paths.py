"""Every CUDA path of shoal, each by a test that fails if the path breaks (docs/GPU.md lists them).

The ``gpu`` tests skip without CUDA (tests/conftest.py); the same logic on the CPU (``cpu`` params)
runs everywhere, so at least the code path is exercised in CI. One GPU cannot hold two NCCL ranks
(NCCL refuses two ranks on one device): what needs two GPUs says so and skips; with one, two spawned
workers share it over gloo instead.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import run_shoal
from shoal.data import make_loader
from shoal.train.step import Step, in_channels_last

SCRIPT = Path(__file__).with_name("scripts") / "cuda_workers.py"
CUDA = pytest.param("cuda", marks=pytest.mark.gpu)
DEVICES = ["cpu", CUDA]


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _workers(*args: str, timeout: float = 240) -> list[dict]:
    import warm

    proc = warm.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- AMP: bf16 autocast, fp16 with the grad scaler (the trainer's Step, in this process) ------------


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_autocast_computes_in_bf16_and_keeps_float32_weights(device):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4)).to(device)
    seen = []
    model[0].register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    step = Step(model, torch.optim.SGD(model.parameters(), lr=0.1), "bf16", torch.device(device))
    assert not step.scaler.is_enabled()
    x, y = torch.randn(64, 8, device=device), torch.randint(0, 4, (64,), device=device)
    losses = []
    for _ in range(20):
        losses.append(step.micro_batch(x, y, weight=1.0, sync=True).item())
        step.apply()
    assert seen[0] == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("device", DEVICES)
def test_fp16_grad_scaler_skips_an_overflowing_step_and_lowers_its_scale(device):
    torch.manual_seed(0)
    model = nn.Linear(8, 4).to(device)
    blow_up, seen = {"on": False}, []

    def loss_fn(out, y):
        seen.append(out.dtype)
        loss = F.cross_entropy(out.float(), y)
        return loss * float("inf") if blow_up["on"] else loss

    step = Step(model, torch.optim.SGD(model.parameters(), lr=0.1), "fp16", torch.device(device), loss_fn=loss_fn)
    assert step.scaler.is_enabled()
    x, y = torch.randn(16, 8, device=device), torch.randint(0, 4, (16,), device=device)
    step.micro_batch(x, y, weight=1.0, sync=True)
    assert seen == [torch.float16]  # autocast's forward
    before = model.weight.detach().clone()
    step.apply()
    assert not torch.equal(model.weight, before)  # a finite step was taken
    scale = step.scaler.get_scale()
    blow_up["on"] = True
    after_good = model.weight.detach().clone()
    step.micro_batch(x, y, weight=1.0, sync=True)
    step.apply()
    assert torch.equal(model.weight, after_good)  # inf gradients: the optimizer step was skipped
    assert step.scaler.get_scale() == scale * step.scaler.get_backoff_factor()


# -- channels-last, pinned memory and non-blocking copies ------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_channels_last_batches_reach_the_device_in_nhwc(device):
    conv = nn.Conv2d(3, 8, 3).to(device).to(memory_format=torch.channels_last)
    images, labels = torch.randn(4, 3, 9, 9, device=device), torch.arange(4, device=device)
    inputs, _ = in_channels_last(None)((images, labels))
    assert inputs.device.type == device and inputs.is_contiguous(memory_format=torch.channels_last)
    out, reference = conv(inputs), conv(images.contiguous())
    assert out.is_contiguous(memory_format=torch.channels_last)
    # cuDNN may compute either in TF32 (its default for convolutions), with other kernels per format.
    assert torch.allclose(out, reference, atol=1e-4 if device == "cpu" else 2e-2)


class _Pairs(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


@pytest.mark.parametrize("device", DEVICES)
def test_loaders_pin_host_memory_and_copy_without_blocking_only_for_cuda(device):
    x, y = torch.randn(64, 5), torch.arange(64)
    target = torch.device(device)
    per_sample = make_loader(_Pairs(x, y), 8, rank=0, world_size=1, shuffle=False, device=target)
    on_cuda = device == "cuda"
    assert per_sample.dataloader.pin_memory is on_cuda and per_sample.non_blocking is on_cuda
    for loader in (per_sample, make_loader((x, y), 8, rank=0, world_size=1, shuffle=False, device=target)):
        batches = list(loader)  # every copy queued before any is read: non-blocking copies must still land
        got_x = torch.cat([b[0] for b in batches])
        got_y = torch.cat([b[1] for b in batches])
        assert got_x.device.type == device and torch.equal(got_x.cpu(), x) and torch.equal(got_y.cpu(), y)


# -- FSDP2 CPU offload (mixed precision: tests/distributed/test_fsdp.py) ------------------------------


@pytest.mark.gpu
def test_fsdp_cpu_offload_keeps_shards_on_the_host_and_trains_on_the_gpu():
    import torch.distributed as dist

    from shoal.distributed.fsdp import apply_fsdp
    from shoal.workloads.language_model import TinyGPT

    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = apply_fsdp(TinyGPT.preset("tiny"), device="cuda", mixed_precision="bf16", cpu_offload=True)
        assert all(p.to_local().device.type == "cpu" for p in model.parameters())
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        tokens = torch.randint(0, 256, (4, 33), device="cuda")
        losses = []
        for _ in range(8):
            logits = model(tokens[:, :-1])
            assert logits.device.type == "cuda" and logits.dtype == torch.bfloat16
            loss = F.cross_entropy(logits.float().reshape(-1, 256), tokens[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        assert losses[-1] < losses[0]
        moments = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim()]
        assert moments and all(v.to_local().device.type == "cpu" for v in moments)
    finally:
        dist.destroy_process_group()


# -- workers: pinned to their GPU, spawned, over nccl on the interface shoal chose --------------------


@pytest.mark.multiprocess
@pytest.mark.parametrize("device", DEVICES)
def test_each_worker_is_pinned_to_its_local_device_on_the_backend_and_interface_shoal_chose(device):
    if device == "cuda" and _gpus() < 2:
        pytest.skip("needs 2 GPUs: one GPU cannot hold two nccl ranks (see the shared-GPU test)")
    ranks = _workers("pinned", device)
    backend, ifname = ("nccl", "NCCL_SOCKET_IFNAME") if device == "cuda" else ("gloo", "GLOO_SOCKET_IFNAME")
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        expected = f"cuda:{r['local_rank']}" if device == "cuda" else "cpu"
        assert r["device"] == expected and r["sum_device"] == expected
        assert r["current_device"] == (r["local_rank"] if device == "cuda" else None)
        assert r["backend"] == backend and r["ifnames"][ifname] == "lo"  # one node: loopback
        assert r["sum"] == 3.0


@pytest.mark.gpu
@pytest.mark.multiprocess
def test_two_spawned_workers_share_one_gpu_over_gloo():
    ranks = _workers("shared")
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert r["backend"] == "gloo" and r["sum_device"] == "cuda:0"
        assert r["sum"] == 3.0 and r["all_equal"]
        assert r["gathered"] == [[0.0, 0.0], [1.0, 1.0]]


@pytest.mark.multiprocess
@pytest.mark.parametrize("device", DEVICES)
def test_the_collective_backend_works_on_the_interface_the_launcher_set(device):
    """shoal's launcher sets GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME (loopback on one node); NCCL
    bootstraps over that interface, so a wrong value fails its init ("no socket interface found")."""
    proc = run_shoal("run", "--nproc", "1", str(SCRIPT), "ifname", device, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (seen,) = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["ifnames"] == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    assert seen["backend"] == ("nccl" if device == "cuda" else "gloo")
    assert seen["sum"] == 4.0 and seen["device"].startswith(device)


# -- the trainer on CUDA: spawned workers, fp16 with its scaler, channels-last, pinned batches ---------


@pytest.mark.gpu
@pytest.mark.multiprocess
def test_shoal_train_on_cuda_with_fp16_and_channels_last(tmp_path):
    nproc = str(min(2, _gpus()))
    out = tmp_path / "run"
    proc = run_shoal(
        "train", "synthetic", "--device", "cuda", "--amp", "fp16", "--arch", "resnet18", "--image-size", "16",
        "--samples", "256", "--batch-size", "32", "--epochs", "2", "--nproc", nproc, "--out", str(out), timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    extra = json.loads((out / "config.json").read_text())["extra"]
    assert extra["device"] == "cuda:0" and extra["channels_last"] is True
    if nproc == "2":
        assert extra["start_method"] == "spawn"
    checkpoint = torch.load(sorted((out / "checkpoints").glob("ckpt-*.pt"))[-1], weights_only=False)
    assert checkpoint["state"]["scaler"]["scale"] > 0  # the grad scaler ran (disabled, it saves {})
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["train_loss"] == r["train_loss"] for r in records)  # no NaN got through the scaler
