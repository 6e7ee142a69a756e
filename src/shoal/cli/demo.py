"""``shoal demo send-recv|all-reduce``: the first things to run on a new cluster.

Both join the job through :func:`shoal.init`, so they run unchanged under every launcher
(``shoal run``, torchrun, ``srun``, ``mpirun``, a Kubernetes pod); ``--nproc N`` starts N local
workers itself (with the rendezvous flags of ``shoal train``, one command per node). Every rank
prints one line saying where it runs and what it got, and the command exits non-zero if any rank
got a wrong result, so a broken network shows up as a named rank, not as a hang.

What each rank runs is in :mod:`shoal.doctor.demo`; this module is the flags and one call.
"""

from __future__ import annotations

import argparse
import sys

from shoal.cli.fields import add_fields, given_fields
from shoal.cli.parser import HelpFormatter
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
        formatter_class=HelpFormatter,
    )
    demos = parser.add_subparsers(dest="demo", metavar="DEMO", required=True)
    for name, help_text in DEMOS.items():
        p = demos.add_parser(
            name,
            help=help_text,
            description=help_text,
            epilog=EXAMPLES,
            formatter_class=HelpFormatter,
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
    from shoal.doctor.demo import demo_rank
    from shoal.launch.local import run_here_or_launch
    from shoal.launch.options import LaunchOptions

    if args.size < 1:
        raise ShoalError(f"--size must be at least 1, got {args.size}", "pass --size 1000, for example")
    iters = getattr(args, "iters", 0) or 0
    if iters < 0:
        raise ShoalError(f"--iters must be >= 0, got {iters}", "pass --iters 5, for example")
    options = LaunchOptions.from_environment(given_fields(args, args.launch_fields))
    results = run_here_or_launch(demo_rank, (args.demo, args.size, iters), options)
    return max((code or 0 for code in results.values()), default=0)


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
