"""``shoal demo send-recv|all-reduce``: the first things to run on a new cluster.

Both join the job through :func:`shoal.init`, so they run unchanged under every launcher
(``shoal run``, torchrun, ``srun``, ``mpirun``, a Kubernetes pod); ``--nproc N`` starts N local
workers itself (with the rendezvous flags of ``shoal train``, one command per node). Every rank
prints one line saying where it runs and what it got, and the command exits non-zero if any rank
got a wrong result, so a broken network shows up as a named rank, not as a hang.

- ``send-recv``: rank 0 sends every other rank its own tensor (values ``1000 * rank + i``), which
  each checks and prints with the time it took: point-to-point paths from rank 0 to everyone.
- ``all-reduce``: every rank contributes ``rank + 1``; everyone must get ``N (N + 1) / 2``; then a
  few timed all-reduces of ``--size`` floats give the bus bandwidth (rank 0 prints it).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

from shoal.cli.fields import add_fields, given_fields
from shoal.errors import ShoalError

EXAMPLES = """\
examples:
  shoal demo all-reduce --nproc 2                     # 2 local workers
  shoal run --nproc 2 -m shoal demo send-recv         # under shoal run (or torchrun)
  torchrun --nproc-per-node 4 -m shoal demo all-reduce
  srun -N 2 -n 8 shoal demo all-reduce                # Slurm: one task per process
  mpirun -np 4 -x MASTER_ADDR=node1 -x MASTER_PORT=29500 shoal demo send-recv
  # two nodes, by hand (run on each node, with its own --node-rank):
  shoal demo all-reduce --nproc 2 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1
"""

DEMOS = {
    "send-recv": "rank 0 sends a tensor to every other rank; each prints what it received",
    "all-reduce": "sum one value per rank across all ranks, check it, measure bandwidth",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``shoal demo`` with its two demos."""
    from shoal.launch.options import LaunchOptions

    parser = subparsers.add_parser(
        "demo",
        help="message-passing demos to check a cluster (send-recv, all-reduce)",
        description="Message-passing checks that run under every launcher (shoal run, torchrun, srun,\n"
        "mpirun) or start their own workers with --nproc. Each rank prints where it runs and what it\n"
        "got; the exit status is non-zero if any rank got a wrong result.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demos = parser.add_subparsers(dest="demo", metavar="DEMO", required=True)
    for name, help_text in DEMOS.items():
        p = demos.add_parser(
            name,
            help=help_text,
            description=help_text,
            epilog=EXAMPLES,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument(
            "--size",
            type=int,
            default=1 << 20 if name == "all-reduce" else 1000,
            metavar="N",
            help="floats per tensor (default: %(default)s)",
        )
        if name == "all-reduce":
            p.add_argument(
                "--iters",
                type=int,
                default=5,
                metavar="K",
                help="timed all-reduces for the bandwidth figure (default 5; 0: none)",
            )
        launch = add_fields(p, LaunchOptions, only=("nproc", "start_method", "max_restarts", "verbose"))
        nodes = p.add_argument_group("across nodes", "Run the same command on every node; see docs/MULTINODE.md.")
        launch += add_fields(nodes, LaunchOptions, exclude=(*launch, "rdzv_conf"))
        p.set_defaults(func=main_args, launch_fields=launch)


def main_args(args: argparse.Namespace) -> int:
    """Run the demo here (already one rank of a job), or start ``--nproc`` workers for it."""
    from shoal.launch.local import run_here_or_launch
    from shoal.launch.options import LaunchOptions

    if args.size < 1:
        raise ShoalError(f"--size must be at least 1, got {args.size}", "pass --size 1000, for example")
    iters = getattr(args, "iters", 0) or 0
    if iters < 0:
        raise ShoalError(f"--iters must be >= 0, got {iters}", "pass --iters 5, for example")
    options = LaunchOptions.from_environment(given_fields(args, args.launch_fields))
    results = run_here_or_launch(run_worker, (args.demo, args.size, iters), options)
    return max((code or 0 for code in results.values()), default=0)


def run_worker(demo: str, size: int, iters: int) -> int:
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


def main(argv: list[str] | None = None) -> int:
    """``python -m shoal.cli.demo DEMO ...``: the same as ``shoal demo DEMO ...``."""
    parser = argparse.ArgumentParser(prog="shoal")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["demo", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except ShoalError as err:
        print(err.format(), file=sys.stderr, flush=True)
        return err.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
