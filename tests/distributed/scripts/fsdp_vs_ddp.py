"""FSDP2 against DDP on 2 gloo ranks (run under torchrun by tests/distributed/test_fsdp.py).

``fsdp_vs_ddp.py RESULT MODEL_PT [STEPS [losses]]``; with ``losses`` it only prints how far
the two runs' losses and weights are apart (docs/SHARDING.md's figure, e.g. 50 steps at 4 ranks).
Writes a JSON of what rank 0 saw: the losses of the same TinyGPT trained from the same seed on the
same batches by DDP and by FSDP, the largest difference of their final weights, what model.pt
holds, a ResNet-18 and a bf16 TinyGPT trained under FSDP, and the blocks found.
"""

import json
import sys

import torch
import torch.distributed as dist
import torchvision

from shoal.distributed.fsdp import apply_fsdp, find_blocks, is_fsdp, load_full_state_dict
from shoal.distributed.process_group import destroy_process_group
from shoal.distributed.wrap import model_state_dict, wrap_model
from shoal.workloads.language_model import TinyGPT, lm_loss, text_datasets

out_path, model_path = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)
cpu = torch.device("cpu")
STEPS, BATCH = (int(sys.argv[3]) if len(sys.argv) > 3 else 12), 4
ONLY_LOSSES = len(sys.argv) > 4 and sys.argv[4] == "losses"  # the docs' figure: skip bf16 and ResNet
train, _ = text_datasets(seq_len=32, n_bytes=20_000)


def batch(step):
    # Each rank its own samples (the data-parallel shard), the same for both strategies.
    idx = [(step * world * BATCH + rank * BATCH + i) % len(train) for i in range(BATCH)]
    xs, ys = zip(*(train[i] for i in idx))
    return torch.stack(xs), torch.stack(ys)


def train_gpt(strategy, **fsdp_options):
    torch.manual_seed(0)
    model = TinyGPT.preset("tiny")
    model = wrap_model(model, strategy=strategy, device=cpu, world_size=world, **fsdp_options)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses, dtypes = [], set()
    for step in range(STEPS):
        x, y = batch(step)
        logits = model(x)
        dtypes.add(str(logits.dtype))
        loss = lm_loss(logits, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    return model, losses, sorted(dtypes)


ddp, ddp_losses, _ = train_gpt("ddp")
fsdp, fsdp_losses, fsdp_dtypes = train_gpt("fsdp")
local_shapes = {n: tuple(p.to_local().shape) for n, p in fsdp.named_parameters()}
ddp_state = model_state_dict(ddp)
fsdp_state = model_state_dict(fsdp)  # collective: every rank calls it
result = {
    "world": world,
    "is_fsdp": is_fsdp(fsdp),
    "blocks": len(find_blocks(TinyGPT.preset("tiny"))),
    "ddp_losses": ddp_losses,
    "fsdp_losses": fsdp_losses,
    "fsdp_dtypes": fsdp_dtypes,
    "head_local_shape": local_shapes["head.weight"],
    "rank_state_keys": len(fsdp_state),
}
# model.pt (a plain full state dict, here DDP's, on every rank) into a fresh FSDP model.
torch.manual_seed(5)
reloaded = wrap_model(TinyGPT.preset("tiny"), strategy="fsdp", device=cpu, world_size=world)
load_full_state_dict(reloaded, ddp_state)
reloaded_state = model_state_dict(reloaded)
if rank == 0:
    result["reloaded_max_diff"] = max((ddp_state[k] - reloaded_state[k]).abs().max().item() for k in ddp_state)
    assert sorted(ddp_state) == sorted(fsdp_state), (sorted(ddp_state), sorted(fsdp_state))
    result["state_keys"] = sorted(fsdp_state)
    result["state_types"] = sorted({type(v).__name__ for v in fsdp_state.values()})
    result["max_weight_diff"] = max((ddp_state[k] - fsdp_state[k]).abs().max().item() for k in ddp_state)
    torch.save(fsdp_state, model_path)

if ONLY_LOSSES:
    if rank == 0:
        diffs = [abs(a - b) / b for a, b in zip(ddp_losses, fsdp_losses)]
        print(
            f"{world} ranks, {STEPS} steps: loss {ddp_losses[0]:.4f} -> {ddp_losses[-1]:.4f}; FSDP vs DDP largest "
            f"relative difference {max(diffs):.2e}, weights {result['max_weight_diff']:.2e}",
            flush=True,
        )
    destroy_process_group()  # then a collection: under torchrun, no exit hook (docs/CLIENTS.md)
    sys.exit(0)

# bf16 mixed precision on CPU: bf16 compute, float32 shards and reduction.
bf16, bf16_losses, bf16_dtypes = train_gpt("fsdp", mixed_precision="bf16")
result["bf16_losses"] = bf16_losses
result["bf16_dtypes"] = bf16_dtypes
result["bf16_param_dtypes"] = sorted({str(p.dtype) for p in bf16.parameters()})

# ResNet-18 on a tiny input: FSDP per stage; a fixed batch, so the loss must fall (by 25x in 3 steps).
torch.manual_seed(1)
resnet = torchvision.models.resnet18(num_classes=10)
result["resnet_blocks"] = len(find_blocks(resnet))
resnet = apply_fsdp(resnet, device=cpu)
opt = torch.optim.SGD(resnet.parameters(), lr=0.05, momentum=0.9)
gen = torch.Generator().manual_seed(rank)
images, labels = torch.randn(4, 3, 32, 32, generator=gen), torch.randint(0, 10, (4,), generator=gen)
resnet_losses = []
for _ in range(3):
    loss = torch.nn.functional.cross_entropy(resnet(images), labels)
    loss.backward()
    opt.step()
    opt.zero_grad()
    resnet_losses.append(loss.item())
result["resnet_losses"] = resnet_losses

if rank == 0:
    with open(out_path, "w") as f:
        json.dump(result, f)
dist.barrier()
destroy_process_group()
