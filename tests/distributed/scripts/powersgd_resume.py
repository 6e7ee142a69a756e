"""Run under torchrun with 2 processes: PowerSGD's state through a checkpoint file, resumed in a fresh DDP model.

Writes a JSON report (rank 0) to argv[1]: whether the resumed model ends bit-identical to the
uninterrupted one, how far a resume without the hook's state lands, and what the state held.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import shoal
from shoal.distributed.comm_hooks import register_comm_hook

START, CHECKPOINT_AT, STEPS = 3, 6, 8


def build(ctx):
    torch.manual_seed(0)
    # 1728 x 2048 + 2048 x 2048 + ... floats: 31 MB, more than one of DDP's 25 MB buckets, so the
    # re-bucketed layout (two buckets) differs from a fresh DDP model's first step (one bucket).
    model = nn.Sequential(
        nn.Flatten(), nn.Linear(1728, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10)
    )
    ddp = ctx.wrap(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hook = register_comm_hook(ddp, "powersgd", rank=2, start_iter=START)
    return model, ddp, optimizer, hook


def train(ddp, optimizer, batches):
    for inputs, targets in batches:
        F.cross_entropy(ddp(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad()


def main(out: Path) -> None:
    ctx = shoal.init(device="cpu", threads=1)
    generator = torch.Generator().manual_seed(100 + ctx.rank)  # each rank its own data
    batches = [
        (torch.randn(8, 3, 24, 24, generator=generator), torch.randint(0, 10, (8,), generator=generator))
        for _ in range(STEPS)
    ]

    model, ddp, optimizer, hook = build(ctx)
    train(ddp, optimizer, batches[:CHECKPOINT_AT])
    path = out.parent / f"ckpt-rank{ctx.rank}.pt"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "hook": hook.state_dict()}, path)
    buckets = len(hook._placed)
    train(ddp, optimizer, batches[CHECKPOINT_AT:])
    reference = {k: v.clone() for k, v in model.state_dict().items()}

    def resumed(with_hook_state: bool):
        model, ddp, optimizer, hook = build(ctx)
        saved = torch.load(path, weights_only=True)  # a checkpoint must load without running code
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        if with_hook_state:
            hook.load_state_dict(saved["hook"])
        else:
            hook.state.iter = saved["hook"]["iter"]  # PowerSGD on at once, but from fresh memories
        seen = []  # the bucket layouts DDP hands the hook in the resumed first step
        run = hook.run
        hook.run = lambda bucket: seen.append([hook._index[p.data_ptr()] for p in bucket.parameters()]) or run(bucket)
        train(ddp, optimizer, batches[CHECKPOINT_AT : CHECKPOINT_AT + 1])
        hook.run = run
        train(ddp, optimizer, batches[CHECKPOINT_AT + 1 :])
        diff = max((reference[k] - v).abs().max().item() for k, v in model.state_dict().items())
        identical = all(torch.equal(reference[k], v) for k, v in model.state_dict().items())
        return identical, diff, hook, seen

    identical, diff, hook_after, first_step = resumed(True)
    identical_without, diff_without, *_ = resumed(False)
    saved = torch.load(path, weights_only=True)["hook"]
    if ctx.is_main:
        out.write_text(
            json.dumps(
                {
                    "identical": identical,
                    "max_diff": diff,
                    "identical_without_state": identical_without,
                    "max_diff_without_state": diff_without,
                    "saved_iter": saved["iter"],
                    "saved_params": sorted(saved["params"]),
                    "saved_pieces": {str(k): sorted(v) for k, v in saved["params"].items()},
                    "buckets_before": buckets,
                    "first_step_after_resume": first_step,
                    "buckets_after_resume": sorted(list(b) for b in hook_after._placed.values()),
                    "iter_after": hook_after.state.iter,
                    "world_size": dist.get_world_size(),
                }
            )
        )
    ctx.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
