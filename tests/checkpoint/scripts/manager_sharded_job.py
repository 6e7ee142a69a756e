"""The checkpoint manager with sharded (.dcp) checkpoints in real processes (run by
tests/checkpoint/test_manager_sharded.py), under torchrun (gloo); its ``load`` also in one plain
process (no process group), the test's own, which imports this module (rank 0 of 1).

Every run trains a TinyGPT ``tiny`` with Adam; each step's batch is drawn from the global RNG
(each rank seeded differently), so an exact resume needs the RNG states back, and a per-rank
counter and a shared data position ride along. Modes:

Each argument is one job, its fields joined by ``:``; the jobs run one after the other in the
same processes.

* ``train:DIR:STRATEGY:FORMAT:STEPS[:resume]``: STRATEGY ``fsdp``/``ddp``/``none``, FORMAT ``dcp``
  (sharded), ``async`` (sharded, async) or ``pt``; saves every 2 steps with keep=2 into DIR; rank 0
  writes the full model and optimizer state at every save (``DIR/../full-<step>.pt`` ...) and at
  the end ``DIR.final.pt`` (plus every rank's next random draw, per-rank counter and the position).
  With ``resume``, it first resumes the newest checkpoint in DIR (so a copy of a checkpoint of
  another strategy or format, or of another world size).
* ``load:RESULT:STRATEGY:CKPT:REFERENCE``: loads CKPT into a fresh model with
  :meth:`CheckpointManager.load_into` and writes how far its full state is from REFERENCE.
* ``refuse:RESULT``: a ``.pt`` manager given an FSDP model refuses it, on every rank.
* ``copy:SOURCE:DIR``: rank 0 copies the checkpoint SOURCE (a ``.dcp`` directory or a ``.pt``
  file) into a new directory DIR, while the other ranks wait (what a user does between two runs).
* ``kill:DIR``: an async sharded save, then a second one, during which rank 0 SIGKILLs the whole
  job (torchrun and every worker) once the first shard file appears.
"""

import json
import os
import shutil
import signal
import sys
from pathlib import Path

import torch
from jobkit import Counter, diffs, everyone, full_state, init, run_jobs, watch_first_shard, wrap

from shoal.checkpoint.manager import CheckpointManager
from shoal.workloads.language_model import TinyGPT, lm_loss

rank, world = 0, 1  # as a script: the torchrun job's (main below)


def build(strategy, preset="tiny"):
    torch.manual_seed(0)
    model = wrap(TinyGPT.preset(preset), strategy)
    torch.manual_seed(100 + rank)  # the batches: each rank its own stream, in the checkpoint
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def step(model, opt):
    x = torch.randint(0, 256, (2, 32))  # the tiny preset's sequence length
    lm_loss(model(x)[:, :-1], x[:, 1:]).backward()
    opt.step()
    opt.zero_grad()


def train(directory, strategy, fmt, steps, resume=False):
    directory = Path(directory)
    model, opt = build(strategy)
    position, counter = Counter(0), Counter(1000 * rank)
    state = {"model": model, "optimizer": opt, "position": position}
    per_rank = {"counter": counter}
    manager = CheckpointManager(directory, every="2steps", keep=2, sharded=fmt != "pt", async_save=fmt == "async")
    start = 0
    if resume:
        found = manager.resume(state, per_rank=per_rank)
        assert found is not None and found.step == position.value, (found, position.value)
        start = found.step
        if rank == 0:
            print(f"resumed {found.path.name} (saved by {found.world_size}) extra={found.extra}", flush=True)
    for done in range(start + 1, steps + 1):
        step(model, opt)
        position.value, counter.value = done, counter.value + 1
        if manager.due(epoch=1, step=done, epoch_end=False):
            reference = full_state(model, opt)
            manager.maybe_save(epoch=1, step=done, epoch_end=False, objects=state, per_rank=per_rank, extra={"x": done})
            if rank == 0:
                torch.save(reference, f"{directory}.full-{done}.pt")
        # An async save goes on in the background while the next step changes every weight.
    manager.wait()
    final = full_state(model, opt)
    ends = everyone({"draw": torch.rand(1).item(), "counter": counter.value})
    if rank == 0:
        torch.save({"state": final, "ranks": ends, "position": position.value}, f"{directory}.final.pt")


def load(result_path, strategy, ckpt, reference_path):
    model, opt = build(strategy)
    position, counter = Counter(-1), Counter(-1)
    found = CheckpointManager(Path(ckpt).parent).load_into(
        ckpt, {"model": model, "optimizer": opt, "position": position}, per_rank={"counter": counter}
    )
    got = full_state(model, opt)
    counters = everyone(counter.value)
    step(model, opt)  # the loaded optimizer steps
    if rank == 0:
        reference = torch.load(reference_path, weights_only=True)
        differences = diffs({part: reference[part] for part in ("model", "optim")}, got)
        result = {
            "values": len(differences),
            "max_diff": max(differences.values()),
            "worst": max(differences, key=differences.get),
            "step": found.step,
            "epoch": found.epoch,
            "extra": found.extra,
            "saved_world": found.world_size,
            "position": position.value,
            "counters": counters,
        }
        Path(result_path).write_text(json.dumps(result))


def kill(directory):
    directory = Path(directory)
    pids = everyone(os.getpid())
    model, opt = build("fsdp", preset="small")
    manager = CheckpointManager(directory, every="1steps", keep=2, async_save=True)
    state = {"model": model, "optimizer": opt, "position": Counter(1)}
    step(model, opt)
    reference = full_state(model, opt)
    manager.save(epoch=1, step=1, objects=state)
    manager.wait()
    if rank == 0:
        torch.save(reference, f"{directory}.full-1.pt")
    step(model, opt)
    state["position"].value = 2
    manager.save(epoch=1, step=2, objects=state)
    if rank == 0:
        # Kill the whole job (torchrun and every worker: the session the test started) while the
        # shards are written from DCP's background thread.
        Path(f"{directory}.killing").write_text(watch_first_shard(directory / ".tmp-ckpt-e00001-s000000002.dcp"))
        os.killpg(os.getpgid(os.getppid()), signal.SIGKILL)  # torchrun (the test made it a group leader)
        for pid in pids:  # torch's agent starts each worker in a session of its own
            if pid != os.getpid():
                os.kill(pid, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
    manager.wait()


def refuse(result_path):
    """A .pt manager refuses an FSDP model (its rank-0 gather would hang) on every rank, at once."""
    from shoal.errors import ShoalError

    model, opt = build("fsdp")
    step(model, opt)
    try:
        CheckpointManager(Path(result_path).parent / "refused").save(epoch=1, step=1, objects={"model": model})
        message = None
    except ShoalError as err:
        message = f"{err.message} HINT: {err.hint}"
    messages = everyone(message)
    if rank == 0:
        Path(result_path).write_text(json.dumps(messages))


def copy(source, directory):
    source, directory = Path(source), Path(directory)
    if rank == 0:
        directory.mkdir()
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, directory / source.name)
    everyone(None)  # the copy is there before any rank goes on


def train_job(directory, strategy, fmt, steps, *resume):
    train(directory, strategy, fmt, int(steps), resume=list(resume) == ["resume"])


if __name__ == "__main__":
    rank, world = init()
    torch.set_num_threads(1)
    run_jobs({"train": train_job, "load": load, "refuse": refuse, "kill": kill, "copy": copy}, sys.argv[1:])
