"""``shoal bench allreduce``: all-reduce latency and bandwidth across N processes, beside memcpy.

For each message size, every rank runs ``dist.all_reduce`` on a tensor of that many bytes (warm-up,
then enough iterations to fill ``--target-time``); the time of one operation is the slowest rank's
mean. The definitions are nccl-tests' (``doc/PERFORMANCE.md`` there):

* ``algbw = bytes / time``;
* ``busbw = algbw x 2(n-1)/n``: what each link must carry for a ring all-reduce, so it can be
  compared with the hardware's bandwidth whatever n is.

The ceiling, measured in the same run and interleaved size by size: rank 0 alone times
``dst.copy_(src)`` of the same size (``memcpy GB/s = bytes / time``) while the other ranks wait,
with the same threads as a worker. On CPU with gloo every byte of an all-reduce crosses memory
(loopback sockets) several times, so busbw far below memcpy is expected; the ratio says how far.
GB/s here are 10^9 bytes per second, sizes are binary (4 KB = 4096 bytes), as in nccl-tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from shoal.bench import report as rep
from shoal.bench.harness import Benchmark, Log, Measured, flag, launch_workers
from shoal.bench.timing import clock
from shoal.env.host import usable_cores
from shoal.errors import ShoalError, check_choice
from shoal.launch.local import check_start_method, resolve_start_method

DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class AllreduceConfig:
    """What ``shoal bench allreduce`` measures."""

    nproc: int = 0
    """Processes; 0: cores on CPU, GPUs on CUDA (at least 2; on CUDA 1 is allowed: NCCL within one GPU)."""
    min_bytes: int = field(default=4 * 2**10, metadata=flag(parse=rep.parse_size, metavar="SIZE", default="4K"))
    """Smallest message, in bytes or with a K, M or G unit (nccl-tests -b)."""
    max_bytes: int = field(default=256 * 2**20, metadata=flag(parse=rep.parse_size, metavar="SIZE", default="256M"))
    """Largest message, in bytes or with a K, M or G unit (nccl-tests -e)."""
    factor: int = 4
    """Each size is the previous one times this (nccl-tests -f)."""
    dtype: str = "float32"
    """Element type of the messages: float32, bfloat16 or float16."""
    warmup: int = 2
    """Untimed operations per size."""
    target_time: float = 0.25
    """Seconds of timed operations per size (at least --min-iters, at most --max-iters operations)."""
    min_iters: int = 3
    """Fewest timed operations per size."""
    max_iters: int = 1000
    """Most timed operations per size."""
    threads: int = 0
    """Intra-op threads per process; 0: cores / processes, as shoal.init picks."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto (CUDA when there are 2 GPUs or more), cpu or cuda."""
    start_method: Literal["auto", "fork", "spawn"] = "auto"
    """How the workers start: auto (fork on CPU, spawn with CUDA), fork or spawn.

    Forked workers inherit the imported torch instead of importing it again (seconds per launch);
    CUDA does not survive a fork. The timings do not depend on it."""

    def __post_init__(self) -> None:
        check_choice("dtype", self.dtype, DTYPES)
        if self.nproc < 0 or (self.nproc == 1 and self.device != "cuda"):
            raise ShoalError(
                f"an all-reduce needs at least 2 processes, got --nproc {self.nproc}",
                "pass --nproc 2 or more (--nproc 1 only with --device cuda: NCCL within one GPU)",
            )
        if not (0 < self.min_bytes <= self.max_bytes):
            raise ShoalError(
                f"message sizes must satisfy 0 < min <= max, got {self.min_bytes}..{self.max_bytes}",
                "pass e.g. --min-bytes 4K --max-bytes 256M",
            )
        if self.factor < 2:
            raise ShoalError(f"--factor must be at least 2, got {self.factor}", "pass --factor 2 (or 4)")
        if self.min_iters < 1 or self.max_iters < self.min_iters or self.target_time <= 0 or self.warmup < 0:
            raise ShoalError(
                "iteration limits must satisfy 1 <= min_iters <= max_iters, target_time > 0",
                "use the defaults, or e.g. --min-iters 3 --max-iters 1000 --target-time 0.25",
            )

        check_start_method(self.start_method)

    def sizes(self) -> list[int]:
        """The message sizes in bytes, each a whole number of elements."""
        itemsize = 4 if self.dtype == "float32" else 2
        out, n = [], self.min_bytes
        while n <= self.max_bytes:
            out.append(max(itemsize, n - n % itemsize))
            n *= self.factor
        return out


SMOKE = dict(min_bytes=4 * 2**10, max_bytes=1 * 2**20, factor=16, warmup=1, target_time=0.01, min_iters=2, max_iters=20)
"""``--smoke``: three sizes, a few iterations each."""


def allreduce_worker(cfg: AllreduceConfig, device_type: str) -> list[dict[str, float]] | None:
    """One rank: time all-reduce (all ranks) and memcpy (rank 0) for every size; rank 0 returns rows."""
    import torch
    import torch.distributed as dist

    import shoal

    ctx = shoal.init(device=device_type, threads=cfg.threads or None)
    # A world of one (--nproc 1 on CUDA): shoal.init joins no group, so this rank makes its own.
    own_group = not dist.is_initialized()
    if own_group:
        dist.init_process_group(ctx.backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        dtype = getattr(torch, cfg.dtype)
        itemsize = torch.empty((), dtype=dtype).element_size()
        rows = []
        for nbytes in cfg.sizes():
            # Zeros: a sum of zeros stays finite however many times it is repeated.
            buf = torch.zeros(nbytes // itemsize, dtype=dtype, device=ctx.device)
            seconds, iters = _time_op(lambda buf=buf: dist.all_reduce(buf), cfg, ctx, collective=True)
            copy_s, copy_iters = math.nan, 0
            if ctx.is_main:
                src = torch.zeros_like(buf)
                dst = torch.empty_like(buf)
                copy_s, copy_iters = _time_op(lambda dst=dst, src=src: dst.copy_(src), cfg, ctx, collective=False)
                del src, dst
            ctx.barrier()
            rows.append(
                {
                    "bytes": nbytes,
                    "seconds": seconds,
                    "iters": iters,
                    "memcpy_seconds": copy_s,
                    "memcpy_iters": copy_iters,
                }
            )
            del buf
        return rows if ctx.is_main else None
    finally:
        if own_group:
            dist.destroy_process_group()
        ctx.shutdown()


def _time_op(op: Callable[[], Any], cfg: AllreduceConfig, ctx, *, collective: bool) -> tuple[float, int]:
    """Mean seconds of ``op`` over a calibrated number of iterations (the slowest rank's, if collective)."""

    from shoal.distributed.probe import slowest as slowest_rank

    def slowest(seconds: float) -> float:
        return slowest_rank(seconds, ctx.device) if collective else seconds

    for _ in range(cfg.warmup):
        op()
    if collective:
        ctx.barrier()
    start = clock(ctx.device)
    op()
    once = slowest(clock(ctx.device) - start)
    # The same count on every rank (each saw the same slowest time), so the loops stay matched.
    iters = int(min(cfg.max_iters, max(cfg.min_iters, math.ceil(cfg.target_time / max(once, 1e-9)))))
    if collective:
        ctx.barrier()
    start = clock(ctx.device)
    for _ in range(iters):
        op()
    return slowest(clock(ctx.device) - start) / iters, iters


def measure(cfg: AllreduceConfig, log: Log) -> Measured:
    """One launch of ``nproc`` processes times every size; rows with nccl-tests' bandwidths."""
    import torch

    from shoal.distributed.bandwidth import ring_factor
    from shoal.distributed.device import choose_backend, choose_device

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    use_gpus = cfg.device == "cuda" or (cfg.device == "auto" and gpus >= max(2, cfg.nproc))
    nproc = cfg.nproc or (gpus if use_gpus else usable_cores())
    # One GPU: a world of one NCCL rank (NCCL refuses two ranks on one device), so the figure is NCCL's
    # own kernel against a device-to-device copy, no link crossed (busbw = 0 by its definition).
    if nproc < (1 if use_gpus else 2):
        what = "GPU" if use_gpus else "core"
        raise ShoalError(
            f"an all-reduce needs at least 2 processes, but this machine has {nproc} {what}(s)",
            "pass --nproc 2 (CPU processes may share a core; use --device cpu without 2 GPUs)",
        )
    device = choose_device(cfg.device, 0, nproc)
    backend = choose_backend("auto", device)
    cfg = replace(cfg, nproc=nproc)
    threads = cfg.threads or max(1, usable_cores() // nproc)
    start_method = resolve_start_method(cfg.start_method, device.type)
    log(f"  launching {nproc} processes ({backend}, {device.type}), {len(cfg.sizes())} sizes")
    raw = launch_workers(allreduce_worker, (replace(cfg, threads=threads), device.type), nproc, start_method)
    factor = ring_factor(nproc)
    rows = []
    for r in raw:
        algbw = r["bytes"] / r["seconds"] / 1e9
        memcpy = r["bytes"] / r["memcpy_seconds"] / 1e9
        rows.append(
            {
                "bytes": r["bytes"],
                "time_us": r["seconds"] * 1e6,
                "iters": r["iters"],
                "algbw_gbps": algbw,
                "busbw_gbps": algbw * factor,
                "memcpy_gbps": memcpy,
                "memcpy_iters": r["memcpy_iters"],
                "busbw_vs_memcpy": algbw * factor / memcpy,
                "algbw_vs_memcpy": algbw / memcpy,
            }
        )
    big = rows[-1]
    note = (
        f"at {rep.size(big['bytes'])}: busbw {big['busbw_gbps']:.2f} GB/s = {big['busbw_vs_memcpy']:.0%} of "
        f"single-process memcpy ({big['memcpy_gbps']:.2f} GB/s, {threads} thread(s)); "
        f"latency at {rep.size(rows[0]['bytes'])}: {rows[0]['time_us']:.0f} us"
    )
    return Measured(
        rows,
        [note],
        config={
            "nproc": nproc,
            "threads": threads,
            "backend": backend,
            "start_method": start_method,
            "sizes": cfg.sizes(),
        },
        device=device.type,
        extra={"busbw_factor": factor},
    )


def text(report: dict[str, Any]) -> list[str]:
    cfg = report["config"]
    return [
        f"all-reduce (sum, {cfg['dtype']}) over {cfg['nproc']} processes, {cfg['backend']}, "
        f"{cfg['threads']} thread(s)/process; busbw = algbw x {report['busbw_factor']:.3g} (2(n-1)/n); "
        f"memcpy = dst.copy_(src) in one process",
        "",
        rep.table(
            ["size", "time (us)", "algbw GB/s", "busbw GB/s", "memcpy GB/s", "busbw/memcpy"],
            [
                [
                    rep.size(r["bytes"]),
                    f"{r['time_us']:.1f}",
                    f"{r['algbw_gbps']:.3f}",
                    f"{r['busbw_gbps']:.3f}",
                    f"{r['memcpy_gbps']:.2f}",
                    f"{r['busbw_vs_memcpy']:.1%}",
                ]
                for r in report["rows"]
            ],
        ),
    ]


def draw(ax: Any, report: dict[str, Any]) -> None:
    rows, cfg = report["rows"], report["config"]
    xs = [r["bytes"] for r in rows]
    ax.plot(xs, [r["busbw_gbps"] for r in rows], "o-", label="all-reduce busbw")
    ax.plot(xs, [r["algbw_gbps"] for r in rows], "s:", label="all-reduce algbw")
    ax.plot(xs, [r["memcpy_gbps"] for r in rows], "k--", label="memcpy (1 process)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("GB/s")
    ax.set_title(f"all-reduce, {cfg['nproc']} processes, {cfg['backend']}")
    ax.legend()


BENCHMARK = Benchmark(
    name="allreduce",
    config=AllreduceConfig,
    smoke=SMOKE,
    measure=measure,
    text=text,
    draw=draw,
    description="Time torch.distributed.all_reduce of 4 KB .. 256 MB across N processes (gloo on CPU, nccl on "
    "GPU); algbw = bytes/time, busbw = algbw x 2(n-1)/n (nccl-tests), beside one process's "
    "dst.copy_(src) of the same size measured in the same run.",
    examples="""\
examples:
  shoal bench allreduce                                 # cores processes, 4 KB .. 256 MB (x4)
  shoal bench allreduce --nproc 4 --min-bytes 1M --max-bytes 1G --factor 2
  shoal bench allreduce --dtype bfloat16 --json ar.json # also writes ar.png
  shoal bench allreduce --device cuda                   # one process per GPU, nccl
  shoal bench allreduce --device cuda --nproc 1         # one GPU: nccl within it, vs a device copy
  shoal bench allreduce --smoke                         # 3 sizes, seconds
""",
)
