"""Entry point of the ``shoal`` command: registers the subcommands and turns errors into messages.

Each subcommand lives in its own module exposing ``register(subparsers)``; the parser it adds sets
``func`` to a callable taking the parsed namespace and returning an exit status. ``shoal run`` takes
its arguments raw (they are torchrun's) and is dispatched before argparse sees them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from shoal.cli.parser import ArgumentParser, HelpFormatter
from shoal.errors import ShoalError

# Subcommands whose arguments are handed over untouched (they have parsers of their own).
_RAW_SUBCOMMANDS = {"run"}


def build_parser() -> argparse.ArgumentParser:
    from shoal.cli import bench as bench_cmd
    from shoal.cli import demo as demo_cmd
    from shoal.cli import doctor as doctor_cmd
    from shoal.cli import env as env_cmd
    from shoal.cli import launch as launch_cmd
    from shoal.cli import run as run_cmd
    from shoal.cli import status as status_cmd
    from shoal.cli import train as train_cmd

    parser = ArgumentParser(
        prog="shoal",
        description="Take a PyTorch training job from one device to many machines without a rewrite.",
        epilog=(
            "examples:\n"
            "  shoal train digits --nproc 2          # train the bundled digits workload on 2 workers\n"
            "  shoal run --nproc 4 train.py --lr 0.1  # torchrun, done right\n"
            "  shoal env                             # what launcher/rank/world size shoal sees here\n"
        ),
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"shoal {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in (train_cmd, run_cmd, launch_cmd, env_cmd, demo_cmd, doctor_cmd, bench_cmd, status_cmd):
        module.register(subparsers)
    return parser


def _version() -> str:
    from shoal import __version__

    return __version__


def strip_local_rank_flag(argv: list[str]) -> list[str]:
    """``argv`` without the ``--local-rank N`` that the legacy ``torch.distributed.launch`` puts in
    front of the subcommand (``python -m shoal --local-rank=0 env``).

    Only leading occurrences go: the same flag inside a user's command (after ``shoal launch --``)
    is theirs. Environment detection reads the flag from ``sys.argv``, which keeps it.
    """
    argv = list(argv)
    while argv:
        if argv[0] in ("--local-rank", "--local_rank"):
            del argv[:2]
        elif argv[0].startswith(("--local-rank=", "--local_rank=")):
            del argv[0]
        else:
            break
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in _RAW_SUBCOMMANDS:
        argv = strip_local_rank_flag(argv)
    try:
        if argv and argv[0] in _RAW_SUBCOMMANDS:
            from shoal.cli import run as run_cmd

            return run_cmd.main_raw(argv[1:])
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    except ShoalError as err:
        if not getattr(err, "quiet", False):  # e.g. a preemption, said once by rank 0
            print(err.format(), file=sys.stderr, flush=True)
        return err.exit_code
    except KeyboardInterrupt:
        print("shoal: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
