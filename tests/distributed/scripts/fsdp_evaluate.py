"""ctx.evaluate of an FSDP model over ranks holding different numbers of batches (run by shoal run).

argv: SAMPLES OUT_JSON. Prints the result on rank 0; a ShoalError is its one line, exit 1."""

import json
import sys

import torch
from torch import nn

import shoal
from shoal.errors import ShoalError

samples, out = int(sys.argv[1]), sys.argv[2]
ctx = shoal.init(device="cpu", seed=0)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
full = {k: v.clone() for k, v in model.state_dict().items()}
inputs = torch.randn(samples, 4, generator=torch.Generator().manual_seed(1))
targets = torch.arange(samples) % 3
dataset = torch.utils.data.TensorDataset(inputs, targets)
sharded = ctx.wrap(model, strategy="fsdp")
loader = ctx.eval_loader(dataset, batch_size=1)
try:
    result = ctx.evaluate(sharded, loader)
except ShoalError as err:
    print(f"rank {ctx.rank}: {err.message}", flush=True)
    ctx.shutdown()
    raise SystemExit(1) from None
if ctx.rank == 0:
    plain = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    plain.load_state_dict(full)
    with torch.no_grad():
        logits = plain(inputs)
    expected = {
        "loss": torch.nn.functional.cross_entropy(logits, targets).item(),
        "accuracy": (logits.argmax(1) == targets).float().mean().item(),
    }
    with open(out, "w") as f:
        json.dump({"result": result, "expected": expected, "batches": len(loader)}, f)
ctx.shutdown()
