"""The step-time probes of ``benchmarks/scale_curves.py``, one rank of a job started by a launcher.

    python benchmarks/scale_probe.py plain|shoal OUT_DIR STEPS_PER_EPOCH
    python benchmarks/scale_probe.py records OUT_DIR STEPS_PER_BLOCK

``plain`` and ``shoal``: the same tiny MLP trained as a hand-written DDP loop or by shoal's trainer.
Both variants are those of ``python -m benchmarks.overhead`` (:mod:`benchmarks.overhead_workers`):
same model (``synthetic`` ``mlp`` on 3x8x8 inputs), same initial weights, same per-rank batches, same
optimizer and learning rate. Every rank runs ``STEPS_PER_EPOCH`` steps per epoch for 3 epochs
whatever the world size (weak scaling); rank 0 writes ``OUT_DIR/<variant>.json``: the mean ms per
step of each epoch after the first, and the world size.

``records``: what the watchdog's progress records cost per step (tests/launch/scripts/progress_overhead.py,
in fewer steps): a digits-size DDP step (64-128-10 MLP, batch 32, gloo, one thread) with a progress
writer's calls (4 phases and ``step_done``: what a script that reports its progress writes) against
the same step with a disabled writer, in alternating blocks on every rank at once; rank 0 writes
``OUT_DIR/records.json``: the median us per step of each.
"""

import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks.*

from benchmarks.overhead_workers import Job, plain_worker, shoal_worker

EPOCHS = 3
BATCH = 16


def records(out: str, steps: int, blocks: int = 8) -> None:
    import tempfile
    import time

    import torch
    import torch.distributed as dist

    from shoal.progress import ProgressWriter

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    model = torch.nn.parallel.DistributedDataParallel(layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    writers = {"on": ProgressWriter(tempfile.mkdtemp(), rank), "off": ProgressWriter(None)}

    def block(writer) -> float:
        dist.barrier()
        begin = time.perf_counter()
        for i in range(steps):
            started = time.perf_counter()
            writer.phase("data", i)
            writer.phase("forward")
            loss = torch.nn.functional.cross_entropy(model(x), y)
            writer.phase("backward")
            optimizer.zero_grad()
            loss.backward()
            writer.phase("optimizer")
            optimizer.step()
            writer.step_done(32, time.perf_counter() - started, 0.0)
        return (time.perf_counter() - begin) / steps

    block(writers["off"])  # warm-up
    timed: dict[str, list[float]] = {"on": [], "off": []}
    for b in range(blocks):
        for name in ("off", "on") if b % 2 == 0 else ("on", "off"):
            timed[name].append(block(writers[name]))
    if rank == 0:
        with open(os.path.join(out, "records.json"), "w") as f:
            json.dump({k: 1e6 * statistics.median(v) for k, v in timed.items()}, f)
    dist.destroy_process_group()


def main() -> None:
    variant, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if variant == "records":
        records(out, steps)
        return
    world_size = int(os.environ["WORLD_SIZE"])
    job = Job(
        model="mlp",
        side=8,
        batch_size=BATCH,
        samples=BATCH * steps * world_size,
        epochs=EPOCHS,
        threads=1,
        out=out,
    )
    result = {"plain": plain_worker, "shoal": shoal_worker}[variant](job)
    if result is None:
        return
    per_step_ms = [1000 * s / result["steps"] for s in result["epoch_s"][1:]]
    with open(os.path.join(out, f"{variant}.json"), "w") as f:
        json.dump({"step_ms": statistics.median(per_step_ms), "world_size": world_size}, f)


if __name__ == "__main__":
    main()
