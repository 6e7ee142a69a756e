"""``python -m benchmarks.memory``: per-rank bytes of parameters, gradients and optimizer state, DDP vs FSDP.

The same TinyGPT (:mod:`shoal.workloads.language_model`; a preset by ``--model``) trains with Adam
under DDP (every rank holds the whole model, its gradients and both Adam moments: 16 bytes per
parameter) and under FSDP2 (:func:`shoal.distributed.fsdp.apply_fsdp`: each rank holds a 1/N shard of
each), at every world size of ``--world-sizes``, one launch of shoal's own launcher per (world size,
strategy), all in one run. Each rank counts the bytes it holds itself, after a backward (gradients)
and an optimizer step (optimizer state): a DTensor counts its local shard (``to_local()``), a
plain tensor all of it. Alongside: the peak resident set size (``getrusage`` ``ru_maxrss``, which
includes the ~0.65 GB of an imported torch: the growth over the RSS at the worker's start is shown
too) and the median step time. The summary is the FSDP/DDP ratio of per-rank bytes and of step
time at each world size.

What FSDP costs: its bytes moved per step. DDP all-reduces the gradients once (a ring moves
2(N-1)/N x 4P bytes per rank for P float32 parameters); FSDP all-gathers each block's parameters
for the forward and again for the backward (it frees them in between: that is the saving) and
reduce-scatters the gradients: 3(N-1)/N x 4P, 1.5x DDP's. On a CPU with gloo, where communication
is not overlapped as well as NCCL on GPUs does, the step is slower by about that much of the
communication's share. Per-rank memory counted here excludes activations and the temporarily
gathered block, which peak RSS includes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from shoal.bench import report as rep
from shoal.bench.harness import Benchmark, Log, Measured, flag, launch_workers, require_at_least
from shoal.bench.timing import median
from shoal.errors import ShoalError

STRATEGIES = ("ddp", "fsdp")
PRESETS = ("tiny", "small", "large")
TARGETS = {2: 0.55, 4: 0.30}
"""FSDP/DDP per-rank bytes (parameters + gradients + optimizer state) at most, at these world sizes."""


@dataclass(frozen=True)
class MemoryConfig:
    """What ``python -m benchmarks.memory`` measures."""

    model: str = "small"
    """TinyGPT preset: tiny (43 K parameters), small (3.3 M) or large (99.8 M: 1.6 GB of Adam state
    per rank under DDP)."""
    world_sizes: tuple[int, ...] = field(
        default=(1, 2, 4), metadata=flag(parse=rep.parse_int_list, metavar="N,N,...", default="1,2,4")
    )
    """World sizes to run both strategies at (one launch each)."""
    batch_size: int = 4
    """Sequences per rank per step."""
    steps: int = 5
    """Timed steps (after the warm-up); the median step time is reported."""
    warmup: int = 2
    """Untimed steps first."""
    threads: int = 1
    """Torch threads per worker (the same for both strategies)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """cpu (gloo) or cuda (nccl, one GPU per rank; the peak of CUDA memory allocated is reported too)."""
    amp: Literal["off", "bf16"] = "off"
    """bf16: FSDP2's mixed precision (bf16 compute, float32 shards and reduction), autocast under DDP."""

    def __post_init__(self) -> None:
        if self.model not in PRESETS:
            raise ShoalError(f"unknown model {self.model!r}", f"pass --model {' or --model '.join(PRESETS)}")
        if not self.world_sizes or any(n < 1 for n in self.world_sizes):
            raise ShoalError(
                f"world sizes must be at least 1, got {list(self.world_sizes)}", "pass --world-sizes 1,2,4 for example"
            )
        require_at_least(self, 1, "batch_size", "steps", "threads")
        require_at_least(self, 0, "warmup")


SMOKE = dict(model="tiny", world_sizes=(1, 2), batch_size=2, steps=2, warmup=1)
"""``--smoke``: the tiny model at 1 and 2 ranks, two timed steps (the machinery, in seconds)."""


def memory_worker(spec: dict[str, Any]) -> list[dict[str, Any]] | None:
    """One rank: wrap the preset, train, count what this rank holds; rank 0 returns every rank's."""
    import os
    import resource
    import time

    import torch
    import torch.distributed as dist

    from shoal.distributed.fsdp import apply_fsdp, local_bytes
    from shoal.distributed.wrap import apply_ddp
    from shoal.workloads.language_model import PRESETS as GPT_PRESETS
    from shoal.workloads.language_model import TinyGPT, lm_loss

    cuda = spec.get("device", "cpu") == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        torch.set_num_threads(spec["threads"])
        rank, world = dist.get_rank(), dist.get_world_size()
        rss_start = _rss_now()
        torch.manual_seed(0)
        model = TinyGPT.preset(spec["model"])
        bf16 = spec.get("amp", "off") == "bf16"
        if spec["strategy"] == "ddp":
            model = apply_ddp(model, device, world)
        else:
            model = apply_fsdp(model, device=device, mixed_precision="bf16" if bf16 else "off")
        # DDP has no mixed-precision policy: autocast is its bf16 (FSDP's policy casts by itself).
        autocast = bf16 and spec["strategy"] == "ddp"
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        seq = GPT_PRESETS[spec["model"]].seq_len
        gen = torch.Generator().manual_seed(rank)
        batches = [torch.randint(0, 256, (spec["batch_size"], seq + 1), generator=gen).to(device) for _ in range(2)]
        grads_bytes, times, loss = 0, [], float("nan")
        for i in range(spec["warmup"] + spec["steps"]):
            tokens = batches[i % 2]
            dist.barrier()
            start = time.perf_counter()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                out = lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
            out.backward()
            grads_bytes = max(grads_bytes, local_bytes(p.grad for p in model.parameters()))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss = out.item()
            if i >= spec["warmup"]:
                times.append(time.perf_counter() - start)
        mine = {
            "rank": rank,
            "params_bytes": local_bytes(model.parameters()),
            "grads_bytes": grads_bytes,
            "optim_bytes": local_bytes(
                v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)
            ),
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "peak_device_bytes": torch.cuda.max_memory_allocated(device) if cuda else 0,
            "rss_start": rss_start,
            "step_s": times,
            "loss": loss,
        }
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, mine)
        return everyone if rank == 0 else None
    finally:
        dist.destroy_process_group()


def _rss_now() -> int:
    """This process's resident set size now, in bytes (Linux; 0 elsewhere)."""
    import os

    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def measure(cfg: MemoryConfig, log: Log) -> Measured:
    from shoal.launch.local import resolve_start_method
    from shoal.workloads.language_model import PRESETS as GPT_PRESETS

    start_method = resolve_start_method("auto", cfg.device)
    n_params = GPT_PRESETS[cfg.model].n_params
    rows = []
    for world in cfg.world_sizes:
        for strategy in STRATEGIES:
            log(f"  {strategy} on {world} process(es)")
            spec = {
                "model": cfg.model,
                "strategy": strategy,
                "batch_size": cfg.batch_size,
                "steps": cfg.steps,
                "warmup": cfg.warmup,
                "threads": cfg.threads,
                "device": cfg.device,
                "amp": cfg.amp,
            }
            ranks = launch_workers(memory_worker, (spec,), world, start_method)
            rows.append(_row(world, strategy, ranks))
    by = {(r["world_size"], r["strategy"]): r for r in rows}
    summary, notes = [], []
    for world in cfg.world_sizes:
        ddp, fsdp = by[(world, "ddp")], by[(world, "fsdp")]
        ratio = fsdp["state_bytes"] / ddp["state_bytes"]
        step_ratio = fsdp["step_s"] / ddp["step_s"]
        fsdp["bytes_vs_ddp"], fsdp["step_vs_ddp"] = ratio, step_ratio
        ddp["bytes_vs_ddp"], ddp["step_vs_ddp"] = 1.0, 1.0
        target = TARGETS.get(world)
        entry = {"world_size": world, "bytes_fsdp_vs_ddp": ratio, "step_fsdp_vs_ddp": step_ratio, "target": target}
        if target is not None:
            entry["target_met"] = ratio <= target
        summary.append(entry)
        verdict = f"{world} rank(s): FSDP holds {ratio:.3f}x DDP's per-rank bytes"
        verdict += f" (target <= {target}: {'met' if ratio <= target else 'NOT met'})" if target is not None else ""
        notes.append(f"{verdict}; FSDP step time {step_ratio:.2f}x DDP's")
    notes.append(
        "bytes moved per step per rank: DDP all-reduce 2(N-1)/N x 4P; FSDP all-gather (forward) + all-gather "
        "(backward) + reduce-scatter = 3(N-1)/N x 4P, 1.5x DDP's; at 1 rank neither communicates"
    )
    notes.append(
        "per-rank bytes: the largest over ranks, counted from the tensors each rank holds (a DTensor's local "
        "shard); activations and FSDP's temporarily gathered block are not in them (peak RSS has them)"
    )
    notes.append(
        "peak RSS includes the imported torch (~0.65 GB): the growth over the RSS at the worker's start is the run's own"
    )
    oversubscribed = [n for n in cfg.world_sizes if n * cfg.threads > _cores()]
    if oversubscribed:
        notes.append(
            f"{', '.join(map(str, oversubscribed))} rank(s) x {cfg.threads} thread(s) oversubscribe the "
            f"{_cores()} cores: their step times measure contention, not FSDP; the bytes are exact regardless"
        )
    config = {"n_params": n_params, "start_method": start_method, "optimizer": "Adam"}
    if cfg.device == "cuda":
        for entry in summary:
            ddp, fsdp = by[(entry["world_size"], "ddp")], by[(entry["world_size"], "fsdp")]
            entry["peak_device_fsdp_vs_ddp"] = fsdp["peak_device_bytes"] / ddp["peak_device_bytes"]
        notes.append(
            "peak GPU MB: torch.cuda.max_memory_allocated on the rank, activations and gathered blocks included"
        )
    return Measured(rows, notes, config=config, device=cfg.device, extra={"summary": summary})


def _row(world: int, strategy: str, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    def most(key: str) -> int:
        return max(r[key] for r in ranks)

    state = max(r["params_bytes"] + r["grads_bytes"] + r["optim_bytes"] for r in ranks)
    return {
        "world_size": world,
        "strategy": strategy,
        "params_bytes": most("params_bytes"),
        "grads_bytes": most("grads_bytes"),
        "optim_bytes": most("optim_bytes"),
        "state_bytes": state,
        "peak_rss": most("peak_rss"),
        "peak_device_bytes": most("peak_device_bytes"),
        "rss_growth": max(r["peak_rss"] - r["rss_start"] for r in ranks),
        "step_s": median([t for r in ranks for t in r["step_s"]]),
        "loss": ranks[0]["loss"],
        "per_rank_state_bytes": [r["params_bytes"] + r["grads_bytes"] + r["optim_bytes"] for r in ranks],
    }


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def text(report: dict[str, Any]) -> list[str]:
    cfg = report["config"]
    mb = lambda n: f"{n / 2**20:,.1f}"  # noqa: E731
    lines = [
        f"TinyGPT {cfg['model']} ({cfg['n_params']:,} parameters), Adam, {cfg['batch_size']} sequence(s) per rank; "
        f"median of {cfg['steps']} step(s) after {cfg['warmup']}; MB = 2^20 bytes, per rank (the largest rank)",
        "",
        rep.table(
            [
                "ranks",
                "strategy",
                "params MB",
                "grads MB",
                "optim MB",
                "total MB",
                "vs DDP",
                "peak RSS MB",
                "RSS growth MB",
                "step ms",
                "step vs DDP",
            ],
            [
                [
                    r["world_size"],
                    r["strategy"],
                    mb(r["params_bytes"]),
                    mb(r["grads_bytes"]),
                    mb(r["optim_bytes"]),
                    mb(r["state_bytes"]),
                    f"{r['bytes_vs_ddp']:.3f}x",
                    mb(r["peak_rss"]),
                    mb(r["rss_growth"]),
                    f"{r['step_s'] * 1e3:,.1f}",
                    f"{r['step_vs_ddp']:.2f}x",
                ]
                for r in report["rows"]
            ],
            align="rl" + "r" * 9,
        ),
    ]
    if cfg.get("device") == "cuda":
        lines += [
            "",
            "peak GPU MB: "
            + ", ".join(f"{r['world_size']} {r['strategy']} {mb(r['peak_device_bytes'])}" for r in report["rows"]),
        ]
    return lines


def draw(ax: Any, report: dict[str, Any]) -> None:
    rows = report["rows"]
    worlds = sorted({r["world_size"] for r in rows})
    for offset, strategy in ((-0.2, "ddp"), (0.2, "fsdp")):
        values = [
            next(r["state_bytes"] for r in rows if r["world_size"] == w and r["strategy"] == strategy) / 2**20
            for w in worlds
        ]
        ax.bar([i + offset for i in range(len(worlds))], values, 0.4, label=strategy)
    ax.set_xticks(range(len(worlds)), [f"{w} rank(s)" for w in worlds])
    ax.set_ylabel("parameters + gradients + optimizer state per rank (MB)")
    ax.set_title(f"TinyGPT {report['config']['model']}: per-rank training state, DDP vs FSDP")
    ax.legend()


BENCHMARK = Benchmark(
    name="memory",
    command="python -m benchmarks.memory",
    config=MemoryConfig,
    smoke=SMOKE,
    measure=measure,
    text=text,
    draw=draw,
    description="Train the same TinyGPT with Adam under DDP and under FSDP at each world size (one launch each, "
    "in one run) and count what each rank holds: bytes of parameters, gradients and optimizer state (a "
    "DTensor's local shard), peak RSS, and the step time; the summary is FSDP/DDP at each world size "
    "(targets: <= 0.55x at 2 ranks, <= 0.30x at 4).",
    examples="""\
examples:
  python -m benchmarks.memory                                # small TinyGPT (3.3 M parameters) at 1, 2, 4 ranks
  python -m benchmarks.memory --model large --world-sizes 4  # 99.8 M parameters: 1.6 GB per rank under DDP
  python -m benchmarks.memory --smoke --json memory.json     # tiny model at 1 and 2 ranks, seconds
  python -m benchmarks.memory --device cuda --amp bf16 --world-sizes 1,2  # GPUs (nccl), FSDP2 bf16 vs DDP autocast
""",
)


if __name__ == "__main__":
    from benchmarks import main

    raise SystemExit(main("memory"))
