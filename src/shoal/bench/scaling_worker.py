"""One rank of ``shoal bench scaling``: train every variant of a launch on the same processes, timed.

Module-level and picklable (workers may be spawned); torch is imported inside the worker only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shoal.bench.timing import clock

POOL_BATCHES = 8
"""Random batches held per rank (the loader cycles over them): bounded memory for any step count."""


@dataclass(frozen=True)
class Variant:
    """One measured configuration inside a launch."""

    name: str
    threads: int
    batch_size: int
    sync: bool = True
    hook: str = "none"
    torch_defaults: bool = False
    """DDP with torch's default options instead of shoal's (``ctx.wrap``)."""


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs (picklable: workers are spawned)."""

    arch: str
    image_size: int
    device: str
    steps: int
    warmup: int
    blocks: int = 1
    variants: tuple[Variant, ...] = field(default_factory=tuple)
    powersgd_rank: int = 2


POWERSGD_START = 2
"""PowerSGD variants compress from this step on (the earliest torch allows: DDP re-buckets after step 1);
their warm-up is at least one step longer, so every timed step is a compressed one."""


def scaling_worker(spec: WorkerSpec) -> dict[str, dict[str, float]] | None:
    """One rank: train every variant for ``warmup + steps`` steps; rank 0 returns the timings, and
    under ``"model"`` the floats one step's gradients take, plain and with PowerSGD."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import shoal
    from shoal.distributed.comm_hooks import register_comm_hook
    from shoal.distributed.comm_hooks.powersgd import powersgd_sizes
    from shoal.workloads.synthetic import NUM_CLASSES, build_synthetic_model

    ctx = shoal.init(device=spec.device, threads=spec.variants[0].threads, seed=0)
    try:
        models: dict[tuple[str, bool], tuple[Any, Any]] = {}
        for v in spec.variants:
            key = (v.hook, v.torch_defaults)
            if key not in models:
                torch.manual_seed(0)
                options = {"gradient_as_bucket_view": False} if v.torch_defaults else {}
                model = ctx.wrap(build_synthetic_model(spec.arch, spec.image_size, NUM_CLASSES), **options)
                register_comm_hook(model, v.hook, rank=spec.powersgd_rank, start_iter=POWERSGD_START)
                models[key] = (model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
        biggest = max(v.batch_size for v in spec.variants)
        pool = biggest * ctx.world_size * min(POOL_BATCHES, spec.steps + spec.warmup)
        gen = torch.Generator().manual_seed(0)
        images = torch.randn((pool, 3, spec.image_size, spec.image_size), generator=gen).to(ctx.device)
        labels = torch.randint(0, NUM_CLASSES, (pool,), generator=gen).to(ctx.device)

        steppers = {}
        for v in spec.variants:
            model, optimizer = models[(v.hook, v.torch_defaults)]
            model.train()
            steppers[v.name] = _stepper(
                model, optimizer, _cycle(ctx.loader((images, labels), batch_size=v.batch_size)), v.sync, F.cross_entropy
            )

        def use(v: Variant) -> None:
            if ctx.device.type == "cpu":
                torch.set_num_threads(v.threads)

        for v in spec.variants:
            use(v)
            for _ in range(max(spec.warmup, POWERSGD_START + 1) if v.hook == "powersgd" else spec.warmup):
                steppers[v.name]()
        # Timed steps in blocks, the variants taking turns (A B C A B C ...): a slow spell of a
        # shared machine then hits every variant, and the comparisons inside a launch stay fair.
        seconds = {v.name: 0.0 for v in spec.variants}
        for block in _blocks(spec.steps, spec.blocks):
            for v in spec.variants:
                use(v)
                ctx.barrier()
                start = clock(ctx.device)
                for _ in range(block):
                    steppers[v.name]()
                elapsed = torch.tensor([clock(ctx.device) - start], dtype=torch.float64, device=ctx.device)
                if ctx.world_size > 1:
                    # The job is as fast as its slowest rank.
                    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                seconds[v.name] += float(elapsed.item())
        shapes = [tuple(p.shape) for p in next(iter(models.values()))[0].parameters()]
        plain, compressed = powersgd_sizes(shapes, spec.powersgd_rank)
        results: dict[str, dict[str, float]] = {"model": {"floats": plain, "powersgd_floats": compressed}}
        for v in spec.variants:
            samples = v.batch_size * ctx.world_size * spec.steps
            results[v.name] = {
                "seconds": seconds[v.name],
                "samples": samples,
                "samples_per_s": samples / seconds[v.name],
            }
        return results if ctx.is_main else None
    finally:
        ctx.shutdown()


def _stepper(model, optimizer, batches, sync: bool, loss_fn) -> Callable[[], None]:
    """One training step of ``model``; DDP's gradient all-reduce skipped when not ``sync``."""
    no_sync = getattr(model, "no_sync", None)

    def step() -> None:
        inputs, targets = next(batches)
        with contextlib.nullcontext() if sync or no_sync is None else no_sync():
            loss_fn(model(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _blocks(steps: int, blocks: int) -> list[int]:
    """``steps`` split into at most ``blocks`` near-equal positive parts: 20, 4 -> [5, 5, 5, 5]."""
    blocks = max(1, min(blocks, steps))
    return [steps // blocks + (1 if i < steps % blocks else 0) for i in range(blocks)]


def _cycle(loader):
    """Batches from ``loader`` forever (a new epoch, reshuffled, whenever one ends)."""
    while True:
        yield from loader
