"""Sharded checkpoints in real processes (run by tests/checkpoint/test_sharded.py).

Under torchrun (gloo); its ``load`` also in one plain process (no process group: a laptop), the test's
own, which imports this module (rank 0 of 1). Each argument is one job, its fields joined by ``:``;
the jobs run one after the other in the same processes (a launch is the cost here):

* ``save:OUT``: trains a TinyGPT 3 steps under FSDP and under DDP and saves each (sync) as
  ``OUT/<strategy>/ckpt-e00001-s000000003.dcp``; then 2 more steps and an async save as
  ``...-s000000005.dcp``, after which the next optimizer step changes the weights at once (the
  save must hold the weights of its call). Rank 0 writes the full model and optimizer state of each
  as ``<name>.reference.pt``, and every rank its next RNG draw.
* ``load:RESULT:STRATEGY=CKPT...``: loads each checkpoint into a fresh model wrapped with
  STRATEGY (``fsdp``, ``ddp`` or ``none``) and writes the largest difference from the reference of
  every parameter and optimizer value, the extras, and whether the per-rank state came back.
* ``kill:OUT``: a sync save, then an async save of a larger model during which rank 0 kills
  itself with SIGKILL as soon as the first shard file appears (the files it saw: ``OUT/killing``).
"""

import json
import os
import signal
import sys
from pathlib import Path

import torch
from jobkit import Counter, diffs, everyone, flat, full_state, init, run_jobs, watch_first_shard, wrap

from shoal.checkpoint.sharded import load_sharded, save_sharded, wait_pending
from shoal.data.sampler import ShardedSampler
from shoal.workloads.language_model import TinyGPT, lm_loss

rank, world = 0, 1  # as a script: the torchrun job's (main below)
SAMPLES, BATCH = 50, 4


class Position(Counter):
    """Stands for the data position: the same on every rank."""


class RankThing(Counter):
    """Stands for a per-rank object (an augmentation RNG): differs between ranks."""


def build(strategy, preset="tiny"):
    torch.manual_seed(0)
    model = wrap(TinyGPT.preset(preset), strategy)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def train(model, opt, steps, start=0):
    seq = model.config.seq_len if hasattr(model, "config") else 32
    for step in range(start, start + steps):
        gen = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randint(0, 256, (2, seq), generator=gen)
        lm_loss(model(x)[:, :-1], x[:, 1:]).backward()
        opt.step()
        opt.zero_grad()


def save(out):
    for strategy in ("fsdp", "ddp"):
        model, opt = build(strategy)
        # The data position: 50 samples, 4 per rank per step; its state is rank 0's, in the checkpoint.
        sampler = ShardedSampler(SAMPLES, rank=rank, world_size=world, seed=0, batch_size=BATCH)
        order, seen = sampler.indices().tolist(), []
        train(model, opt, 3)
        seen += order[: 3 * BATCH]
        sampler.advance(3 * BATCH * world)
        state = {"model": model, "optimizer": opt, "position": Position(3), "sampler": sampler}
        per_rank = {"thing": RankThing(100 + rank)}
        name = out / strategy / "ckpt-e00001-s000000003.dcp"
        reference = full_state(model, opt)
        torch.manual_seed(7 + rank)  # each rank its own RNG state, which the checkpoint keeps
        save_sharded(name, state, per_rank=per_rank, extra={"epoch": 1, "step": 3})
        draw = torch.rand(1).item()  # what a resumed run at this world size must draw next
        seen_everywhere = everyone(seen)
        if rank == 0:
            torch.save(reference, f"{name}.reference.pt")
            with open(f"{name}.seen.json", "w") as f:
                json.dump(seen_everywhere, f)
        with open(out / strategy / f"draw-{rank}.json", "w") as f:
            json.dump(draw, f)
        train(model, opt, 2, start=3)
        seen += order[3 * BATCH : 5 * BATCH]
        sampler.advance(2 * BATCH * world)
        name = out / strategy / "ckpt-e00001-s000000005.dcp"
        reference = full_state(model, opt)
        state["position"] = Position(5)
        pending = save_sharded(name, state, per_rank=per_rank, extra={"epoch": 1, "step": 5}, async_=True)
        train(model, opt, 1, start=5)  # changes every weight while the save may still be writing
        pending.wait()
        seen_everywhere = everyone(seen)
        if rank == 0:
            torch.save(reference, f"{name}.reference.pt")
            with open(f"{name}.seen.json", "w") as f:
                json.dump(seen_everywhere, f)
            print(f"{strategy}: async save blocked {pending.blocked_s:.3f} s", flush=True)


def load(result_path, *pairs):
    results = []
    for pair in pairs:
        strategy, ckpt = pair.split("=", 1)
        model, opt = build(strategy)
        position, thing = Position(), RankThing(-1)
        sampler = ShardedSampler(SAMPLES, rank=rank, world_size=world, seed=0, batch_size=BATCH)
        state = {"model": model, "optimizer": opt, "position": position, "sampler": sampler}
        found = load_sharded(ckpt, state, per_rank={"thing": thing})
        rest = everyone(sampler.indices().tolist())  # the rest of the epoch, re-split over these ranks
        got = full_state(model, opt)
        draws = everyone((torch.rand(1).item(), thing.value))
        train(model, opt, 1, start=10)  # the loaded optimizer steps
        if rank == 0:
            reference = torch.load(f"{ckpt}.reference.pt", weights_only=True)
            differences = diffs(reference, got)
            saved_world = found.world_size
            results.append(
                {
                    "checkpoint": str(ckpt),
                    "strategy": strategy,
                    "values": len(differences),
                    "tensors": sum(isinstance(v, torch.Tensor) for v in flat(reference).values()),
                    "max_diff": max(differences.values()),
                    "worst": max(differences, key=differences.get),
                    "extra": found.extra,
                    "position": position.value,
                    "saved_world": saved_world,
                    "per_rank_restored": found.per_rank_restored,
                    "draws": draws,
                    "seen_before": json.loads(Path(f"{ckpt}.seen.json").read_text()),
                    "rest": rest,
                }
            )
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump(results, f)


def kill(out):
    model, opt = build("fsdp", preset="small")
    train(model, opt, 1)
    state = {"model": model, "optimizer": opt, "position": Position(1)}
    name = out / "ckpt-e00001-s000000001.dcp"
    reference = full_state(model, opt)
    save_sharded(name, state, extra={"step": 1})
    if rank == 0:
        torch.save(reference, f"{name}.reference.pt")
    train(model, opt, 1, start=1)
    state["position"] = Position(2)
    save_sharded(out / "ckpt-e00001-s000000002.dcp", state, extra={"step": 2}, async_=True)
    if rank == 0:
        # Die while the shards are being written: once the first shard file appears (DCP writes it
        # from its background thread, while the main thread goes on).
        with open(out / "killing", "w") as f:
            f.write(watch_first_shard(out / ".tmp-ckpt-e00001-s000000002.dcp"))
        os.kill(os.getpid(), signal.SIGKILL)
    wait_pending()  # rank 1: its peer is gone; torchrun stops it


if __name__ == "__main__":
    rank, world = init()
    torch.set_num_threads(1)
    run_jobs({"save": lambda out: save(Path(out)), "load": load, "kill": lambda out: kill(Path(out))}, sys.argv[1:])
