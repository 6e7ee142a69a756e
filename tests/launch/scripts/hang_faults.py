"""A ``shoal run`` script that reports its progress (``ctx.progress()``) and injects one fault.

Environment:
  FAULT        none | block (the rank blocks forever in its step) | skip (the rank skips one
               all-reduce, runs to the end one collective short and waits in the final barrier) |
               loader (its DataLoader worker blocks in __getitem__) | checkpoint (the rank never
               finishes a checkpoint write) | slow (the rank computes SLOW_FACTOR x longer from
               step FAULT_STEP on) | blip (the rank is slow for BLIP_STEPS steps only)
  FAULT_RANK   the rank that misbehaves (default 1)
  FAULT_STEP   the step where it starts (default 5)
  HANG_MARK    a file where the blocking rank writes the time the hang began
  FAULT_ONCE=1 only in the first attempt (TORCHELASTIC_RESTART_COUNT=0): a restart gets past it
  STEPS        steps in all (default 40); STEP_S: compute per step (default 0.02 s)
  COMPUTE      sleep (default: the same wall time on a loaded machine) | work (WORK_ITERS iterations
               of busy CPU per step: a throttled CPU makes them longer)
  OUT          a directory for the checkpoint (the step, every CKPT_EVERY steps), pid-<rank> and
               pid-blocked-<pid> (the process that blocks)
Prints ``resumed at step N`` when it starts from a checkpoint and ``finished`` at the end.
"""

import json
import os
import time

import torch
import torch.distributed as dist

import shoal

FAULT = os.environ.get("FAULT", "none")
FAULT_RANK = int(os.environ.get("FAULT_RANK", 1))
FAULT_STEP = int(os.environ.get("FAULT_STEP", 5))
STEPS = int(os.environ.get("STEPS", 40))
STEP_S = float(os.environ.get("STEP_S", 0.02))
SLOW_FACTOR = float(os.environ.get("SLOW_FACTOR", 3))
BLIP_STEPS = int(os.environ.get("BLIP_STEPS", 3))
CKPT_EVERY = int(os.environ.get("CKPT_EVERY", 5))
OUT = os.environ.get("OUT", "")
FIRST_ATTEMPT = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
ARMED = FIRST_ATTEMPT or os.environ.get("FAULT_ONCE") != "1"


def block_forever():
    if OUT:  # the blocked process (a rank, or its DataLoader worker): the test checks it is gone too
        with open(os.path.join(OUT, f"pid-blocked-{os.getpid()}"), "w") as f:
            f.write(f"{os.getpid()}\n")
    mark = os.environ.get("HANG_MARK")
    if mark:  # when the hang began, for a test timing the report
        with open(mark, "w") as f:
            f.write(str(time.time()))
    while True:
        time.sleep(3600)  # the hang


def faulty(rank, step, kind):
    return ARMED and kind == FAULT and rank == FAULT_RANK and step == FAULT_STEP


def compute(seconds):
    if os.environ.get("COMPUTE") == "work":
        x = 1.0
        for _ in range(int(os.environ.get("WORK_ITERS", 200000))):
            x = x * 1.0000001 + 1e-9
        return x
    time.sleep(seconds)
    return 0.0


class Samples(torch.utils.data.Dataset):
    def __init__(self, rank):
        self.rank = rank

    def __len__(self):
        return 10**6

    def __getitem__(self, index):
        if faulty(self.rank, index, "loader"):
            block_forever()  # the loader worker stops; the rank waits for its batch
        return torch.ones(4)


def save_checkpoint(rank, step):
    if faulty(rank, step, "checkpoint"):
        block_forever()  # a write to a dead file system
    if rank == 0 and OUT:
        path = os.path.join(OUT, "ckpt.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"step": step}, f)
        os.replace(path + ".tmp", path)


def load_checkpoint():
    path = os.path.join(OUT, "ckpt.json") if OUT else ""
    if path and os.path.exists(path):
        with open(path) as f:
            return json.load(f)["step"]
    return 0


def main():
    ctx = shoal.init()
    progress = ctx.progress()
    rank = ctx.rank
    if OUT:
        with open(os.path.join(OUT, f"pid-{rank}"), "a") as f:
            f.write(f"{os.getpid()}\n")
    start = load_checkpoint()
    if start:
        ctx.print(f"resumed at step {start}", flush=True)
    # One sample per step, in order: a loader fault at index FAULT_STEP is a fault at that step.
    loader = iter(
        torch.utils.data.DataLoader(Samples(rank), batch_size=None, num_workers=1 if FAULT == "loader" else 0)
    )
    for _ in range(start):
        next(loader)
    tensor = torch.ones(4)
    skipped = False
    for step in range(start, STEPS):
        begin = time.perf_counter()
        progress.phase("data", step)
        next(loader)
        progress.phase("forward")
        slow = (
            ARMED
            and rank == FAULT_RANK
            and (
                (FAULT == "slow" and step >= FAULT_STEP)
                or (FAULT == "blip" and FAULT_STEP <= step < FAULT_STEP + BLIP_STEPS)
            )
        )
        compute(STEP_S * (SLOW_FACTOR if slow else 1))
        if faulty(rank, step, "block"):
            block_forever()
        computed = time.perf_counter()
        if faulty(rank, step, "skip"):
            skipped = True  # a branch that thinks this step needs no all-reduce
        else:
            progress.collective()
            dist.all_reduce(tensor)
        progress.phase("optimizer")
        progress.step_done(1, computed - begin, time.perf_counter() - computed)
        if (step + 1) % CKPT_EVERY == 0:
            progress.phase("checkpoint")
            save_checkpoint(rank, step + 1)
    # The end: every rank checks in through the store (a barrier without a collective's tag).
    progress.collective()
    store = dist.distributed_c10d._get_default_store()
    store.add("finished", 1)
    store.wait(["finished"])
    while int(store.add("finished", 0)) < ctx.world_size:
        time.sleep(0.05)
    if skipped:
        print(f"rank {rank} skipped an all-reduce", flush=True)
    ctx.print("finished", flush=True)
    ctx.shutdown()


if __name__ == "__main__":
    main()
