"""What every rank of ``shoal demo send-recv|all-reduce`` runs (the command's flags are in
:mod:`shoal.cli.demo`): the first checks of a new cluster, so they live beside the doctor.

- ``send-recv``: rank 0 sends every other rank its own tensor (values ``1000 * rank + i``), which
  each checks and prints with the time it took: point-to-point paths from rank 0 to everyone.
- ``all-reduce``: every rank contributes ``rank + 1``; everyone must get ``N (N + 1) / 2``
  (:func:`shoal.distributed.probe.checked_all_reduce`, the probe the doctor and ``shoal bench``
  use too); then a few timed all-reduces of ``size`` floats give the bus bandwidth.
"""

from __future__ import annotations

import os
import socket
import time


def demo_rank(demo: str, size: int, iters: int) -> int:
    """One rank: run the demo; in a started worker a failed check exits 1 (the launcher reports it)."""
    code = run_demo(demo, size, iters)
    if code and os.environ.get("TORCHELASTIC_RUN_ID") is not None:
        raise SystemExit(code)
    return code


def run_demo(demo: str, size: int, iters: int = 0) -> int:
    """Join the job, run ``demo``, leave; 0 if every rank got what it should."""
    import shoal

    ctx = shoal.init()
    try:
        if ctx.world_size == 1:
            print(
                f"shoal demo {demo}: only one process ({_where(ctx)}): nothing to exchange; "
                f"try `shoal demo {demo} --nproc 2` or run it under a launcher",
                flush=True,
            )
            return 0
        if demo == "send-recv":
            return _send_recv(ctx, size)
        return _all_reduce(ctx, size, iters)
    finally:
        ctx.shutdown()


def _where(ctx) -> str:
    name = "GLOO_SOCKET_IFNAME" if ctx.backend == "gloo" else "NCCL_SOCKET_IFNAME"
    iface = f" via {os.environ[name]}" if os.environ.get(name) else ""
    return (
        f"rank {ctx.rank}/{ctx.world_size} on {socket.gethostname()}{iface} (node {ctx.node_rank}, "
        f"local rank {ctx.local_rank}, {ctx.device}, {ctx.backend})"
    )


def _payload(rank: int, size: int, device):
    import torch

    return torch.arange(size, dtype=torch.float32, device=device) + 1000.0 * rank


def _show(t) -> str:
    values = ", ".join(f"{v:g}" for v in t[:4].tolist())
    return f"[{values}{', ...' if t.numel() > 4 else ''}] ({t.numel():,} floats)"


def _sync(ctx) -> None:
    import torch

    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)


def _count_bad(ctx, bad: bool) -> int:
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1.0 if bad else 0.0], device=ctx.device)
    dist.all_reduce(flag)
    return int(flag.item())


def _send_recv(ctx, size: int) -> int:
    import torch
    import torch.distributed as dist

    bad = False
    if ctx.rank == 0:
        start = time.perf_counter()
        for dst in range(1, ctx.world_size):
            dist.send(_payload(dst, size, ctx.device), dst=dst)
        _sync(ctx)
        took = (time.perf_counter() - start) * 1e3
        print(
            f"[{_where(ctx)}] sent ranks 1..{ctx.world_size - 1} their tensors ({size:,} floats each) in {took:.1f} ms",
            flush=True,
        )
    else:
        got = torch.empty(size, dtype=torch.float32, device=ctx.device)
        start = time.perf_counter()
        dist.recv(got, src=0)
        _sync(ctx)
        took = (time.perf_counter() - start) * 1e3
        bad = not torch.equal(got, _payload(ctx.rank, size, ctx.device))
        verdict = f"WRONG: expected {_show(_payload(ctx.rank, size, ctx.device))}" if bad else "OK"
        print(f"[{_where(ctx)}] received {_show(got.cpu())} from rank 0 in {took:.1f} ms: {verdict}", flush=True)
    wrong = _count_bad(ctx, bad)
    if ctx.rank == 0:
        others = ctx.world_size - 1
        if wrong:
            print(f"shoal demo send-recv: {wrong} of {others} ranks received a wrong tensor", flush=True)
        else:
            print(
                f"shoal demo send-recv: all {others} other ranks received their tensor from rank 0 "
                f"({ctx.world_size} ranks, {ctx.num_nodes} node{'s' if ctx.num_nodes != 1 else ''})",
                flush=True,
            )
    return 1 if wrong else 0


def _all_reduce(ctx, size: int, iters: int) -> int:
    import torch

    from shoal.distributed.bandwidth import bus_bytes_per_s
    from shoal.distributed.probe import all_reduce_within, checked_all_reduce, slowest

    world = ctx.world_size
    checked = checked_all_reduce(size, rank=ctx.rank, world=world, device=ctx.device)
    print(
        f"[{_where(ctx)}] all_reduce(sum) of {size:,} floats = {checked.got} (expected {checked.expected:g}) in "
        f"{checked.seconds * 1e3:.1f} ms: {'OK' if checked.correct else 'WRONG'}",
        flush=True,
    )
    wrong = _count_bad(ctx, not checked.correct)
    if iters and not wrong:
        t = torch.zeros(size, dtype=torch.float32, device=ctx.device)  # a sum of zeros stays finite
        ctx.barrier()
        seconds = slowest(sum(all_reduce_within(t) for _ in range(iters)) / iters, ctx.device)
        busbw = bus_bytes_per_s(checked.nbytes, seconds, world) / 1e9  # what every link carried
        if ctx.rank == 0:
            print(
                f"shoal demo all-reduce: {world} ranks on {ctx.num_nodes} node"
                f"{'s' if ctx.num_nodes != 1 else ''}: {checked.nbytes / 1e6:.1f} MB in {seconds * 1e3:.2f} ms "
                f"(mean of {iters}), bus bandwidth {busbw:.2f} GB/s",
                flush=True,
            )
    if ctx.rank == 0:
        if wrong:
            print(f"shoal demo all-reduce: {wrong} of {world} ranks got a wrong sum", flush=True)
        else:
            print(f"shoal demo all-reduce: all {world} ranks got the right sum", flush=True)
    return 1 if wrong else 0
