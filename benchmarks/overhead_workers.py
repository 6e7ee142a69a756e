"""The workers of ``python -m benchmarks.overhead``: the same job as a hand-written DDP loop, as ``shoal
train``, through Accelerate and Lightning Fabric, and with ``shoal.horovod`` (see :mod:`benchmarks.overhead`).

Module-level and picklable (workers may be spawned); torch is imported inside the workers only.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LR = 0.01


@dataclass(frozen=True)
class Job:
    """The work every variant does (picklable)."""

    model: str
    side: int
    batch_size: int
    samples: int
    epochs: int
    threads: int
    out: str
    seed: int = 0
    lr: float = LR


# The job's pieces, written as a user would (the plain loop and the peers share them) -----------


def make_data(job: Job):
    """The training set: random images and labels, drawn exactly as the synthetic workload does."""
    import torch

    from shoal.workloads.synthetic import NUM_CLASSES

    generator = torch.Generator().manual_seed(job.seed)
    images = torch.randn((job.samples, 3, job.side, job.side), generator=generator)
    labels = torch.randint(0, NUM_CLASSES, (job.samples,), generator=generator)
    return images, labels


def make_model_and_optimizer(job: Job):
    import torch

    from shoal.workloads.synthetic import build_synthetic_model

    torch.manual_seed(job.seed)
    model = build_synthetic_model(job.model, job.side)  # the synthetic workload's classes
    optimizer = torch.optim.SGD(model.parameters(), lr=job.lr, momentum=0.9, nesterov=True, weight_decay=0.0)
    return model, optimizer


def cosine_lr(job: Job, progress: float) -> float:
    """The learning rate after ``progress`` epochs: cosine from ``lr`` to zero over the run."""
    return job.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress / job.epochs)))


def hand_written_loop(
    job: Job, model, optimizer, backward: Callable[[Any], None], rank: int, world_size: int
) -> list[float]:
    """The tutorials' DDP loop over pre-loaded tensors; returns the seconds of each epoch's training."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DistributedSampler

    images, labels = make_data(job)
    sampler = DistributedSampler(range(job.samples), num_replicas=world_size, rank=rank, shuffle=True, seed=job.seed)
    global_batch = job.batch_size * world_size
    model.train()
    seconds = []
    for epoch in range(job.epochs):
        started = time.perf_counter()
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler))
        for step, first in enumerate(range(0, len(order), job.batch_size)):
            index = order[first : first + job.batch_size]
            inputs, targets = images.index_select(0, index), labels.index_select(0, index)
            loss = F.cross_entropy(model(inputs), targets)
            backward(loss)
            lr = cosine_lr(job, epoch + step * global_batch / job.samples)
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - started)
    return seconds


def _steps_per_epoch(job: Job, world_size: int) -> int:
    per_rank = -(-job.samples // world_size)
    return -(-per_rank // job.batch_size)


def _result(job: Job, seconds: list[float], world_size: int, variant: str, state: dict) -> dict[str, Any]:
    """Rank 0's answer: epoch times, steps per epoch, and the final weights (a file and a digest).

    The digest is taken here, in the worker: the parent must run no torch computation between
    launches, because a worker forked from a process whose OpenMP pool exists can hang in its
    first parallel op (GNU libgomp is not fork-safe).
    """
    import hashlib

    import torch

    state = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    digest = hashlib.sha256()
    for key in sorted(state):
        digest.update(key.encode())
        digest.update(state[key].numpy().tobytes())
    path = Path(job.out) / f"{variant}.pt"
    torch.save(state, path)
    return {
        "epoch_s": seconds,
        "steps": _steps_per_epoch(job, world_size),
        "weights": str(path),
        "digest": digest.hexdigest(),
    }


# One module-level worker per variant (module-level: spawn must be able to pickle them) ----------


def plain_worker(job: Job) -> dict[str, Any] | None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(job.threads)
    dist.init_process_group("gloo")
    try:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        model, optimizer = make_model_and_optimizer(job)
        ddp = DistributedDataParallel(model)
        seconds = hand_written_loop(job, ddp, optimizer, lambda loss: loss.backward(), rank, world_size)
        return _result(job, seconds, world_size, "plain", model.state_dict()) if rank == 0 else None
    finally:
        dist.destroy_process_group()


def train_config(job: Job):
    """The job as ``shoal train synthetic`` takes it: the one place a TrainConfig is built here."""
    from shoal.train.config import TrainConfig

    return TrainConfig(
        workload="synthetic",
        arch=job.model,
        image_size=job.side,
        samples=job.samples,
        batch_size=job.batch_size,
        epochs=job.epochs,
        lr=job.lr,
        optimizer="sgd",
        weight_decay=0.0,
        warmup_epochs=0.0,  # the plain loop's schedule: cosine from the first step, no warm-up
        seed=job.seed,
        device="cpu",
        out=str(Path(job.out) / "shoal-run"),
        checkpoint_every="0",
        resume="never",
        progress=False,
        channels_last=False,  # the plain loop's memory format: the same arithmetic, bit for bit
    )


def shoal_worker(job: Job) -> dict[str, Any] | None:
    import json

    import torch

    from shoal.train.entry import train_rank

    os.environ["OMP_NUM_THREADS"] = str(job.threads)
    cfg = train_config(job)
    rank = int(os.environ.get("RANK", "0"))
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
        train_rank(cfg)
    if rank != 0:
        return None
    run = Path(cfg.out)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    # metrics.jsonl holds each epoch's training throughput: samples seen / training seconds.
    seconds = [r["samples_seen"] / r["samples_per_s"] for r in records]
    world_size = records[0]["world_size"]
    state = torch.load(run / "model.pt", map_location="cpu", weights_only=True)
    return _result(job, seconds, world_size, "shoal", state)


def accelerate_worker(job: Job) -> dict[str, Any] | None:
    import torch
    from accelerate import Accelerator

    torch.set_num_threads(job.threads)
    accelerator = Accelerator(cpu=True)
    model, optimizer = make_model_and_optimizer(job)
    wrapped, optimizer = accelerator.prepare(model, optimizer)
    rank, world_size = accelerator.process_index, accelerator.num_processes
    seconds = hand_written_loop(job, wrapped, optimizer, accelerator.backward, rank, world_size)
    result = _result(job, seconds, world_size, "accelerate", model.state_dict()) if rank == 0 else None
    accelerator.end_training()
    return result


def fabric_worker(job: Job) -> dict[str, Any] | None:
    import logging

    import torch
    from lightning.fabric import Fabric

    torch.set_num_threads(job.threads)
    logging.getLogger("lightning.fabric").setLevel(logging.WARNING)  # its banner would break the table
    world_size = int(os.environ["WORLD_SIZE"])
    fabric = Fabric(accelerator="cpu", devices=world_size, strategy="ddp", num_nodes=1)
    fabric.launch()  # under torch's elastic agent: joins the group, starts nothing
    model, optimizer = make_model_and_optimizer(job)
    wrapped, optimizer = fabric.setup(model, optimizer)
    seconds = hand_written_loop(job, wrapped, optimizer, fabric.backward, fabric.global_rank, world_size)
    result = _result(job, seconds, world_size, "fabric", model.state_dict()) if fabric.global_rank == 0 else None
    with contextlib.suppress(Exception):
        import torch.distributed as dist

        dist.destroy_process_group()
    return result


def horovod_worker(job: Job) -> dict[str, Any] | None:
    """The plain loop on the bare model, its optimizer wrapped as a Horovod script does (``hvd.init()``,
    broadcasts from rank 0, ``hvd.DistributedOptimizer`` with ``op=Average``): shoal.horovod's
    bucketed asynchronous all-reduces instead of DDP's."""
    import torch

    from shoal.horovod import recipe, state

    torch.set_num_threads(job.threads)
    model, optimizer = make_model_and_optimizer(job)
    optimizer = recipe.prepare(model, optimizer)
    try:
        rank, world_size = state.rank(), state.size()
        seconds = hand_written_loop(job, model, optimizer, lambda loss: loss.backward(), rank, world_size)
        return _result(job, seconds, world_size, "horovod", model.state_dict()) if rank == 0 else None
    finally:
        state.shutdown()


WORKERS: dict[str, Callable[[Job], dict[str, Any] | None]] = {
    "plain": plain_worker,
    "shoal": shoal_worker,
    "accelerate": accelerate_worker,
    "fabric": fabric_worker,
    "horovod": horovod_worker,
}
