"""A user's script written against the library API; run under real launchers by the tests."""

import json
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import TensorDataset

import shoal

out_path = sys.argv[1]
ctx = shoal.init(seed=0, device="cpu")
assert shoal.init() is ctx  # idempotent

# Data: each sample's value is its index, so the shard each rank saw can be checked exactly.
train_set = TensorDataset(torch.arange(10, dtype=torch.float32).view(10, 1), torch.zeros(10, dtype=torch.long))
loader = ctx.loader(train_set, batch_size=2)
seen = []
for _epoch in range(2):  # no set_epoch: the loader reshuffles by itself
    seen.append([int(v) for batch in loader for v in batch[0].view(-1).tolist()])

gathered = [None] * ctx.world_size
if ctx.world_size > 1:
    dist.all_gather_object(gathered, seen)
else:
    gathered = [seen]


# Exact evaluation over 11 samples whose logits make exactly the even-indexed ones correct.
class Lookup(nn.Module):
    def forward(self, x):
        correct = (x.view(-1) % 2 == 0).float()
        return torch.stack([correct, 1 - correct], dim=1) * 10


test_set = TensorDataset(torch.arange(11, dtype=torch.float32).view(11, 1), torch.zeros(11, dtype=torch.long))
scores = ctx.evaluate(ctx.wrap(nn.Sequential(Lookup())), ctx.eval_loader(test_set, batch_size=2))

model = ctx.wrap(nn.Linear(3, 2))
mean = shoal.all_reduce_mean({"rank": ctx.rank, "one": 1})
ctx.barrier()
ctx.print("hello from the main process")
if ctx.is_main:
    with open(out_path, "w") as f:
        json.dump(
            {
                "world_size": ctx.world_size,
                "scheme": ctx.environment.scheme,
                "seen": gathered,
                "scores": scores,
                "mean": mean,
                "wrapped": type(model).__name__,
                "clean_keys": sorted(shoal.model_state_dict(model)),
                "threads": torch.get_num_threads(),
            },
            f,
        )
ctx.shutdown()
