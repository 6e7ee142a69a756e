"""``shoal run``: launch a script as N workers per node, a drop-in for torchrun.

The arguments are torchrun's (parsed by torchrun's flags, frozen, in :mod:`shoal.cli.run.args`: no
torch import before an argument error), so :func:`shoal.cli.main.main` hands them over raw to
:func:`main_raw`; :func:`register` only adds the subcommand to ``shoal --help``. The script is
checked here (:mod:`shoal.cli.run.precheck`), then launched by :func:`shoal.launch.run.run_script`.
"""

from __future__ import annotations

import argparse

HELP = "launch a script as N workers per node (torchrun, done right)"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``run`` to ``shoal --help``; ``shoal run --help`` shows torchrun's flags and shoal's."""
    from shoal.cli.run.args import DESCRIPTION, EXAMPLES

    parser = subparsers.add_parser("run", help=HELP, description=DESCRIPTION, epilog=EXAMPLES, add_help=False)
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="[torchrun flags] SCRIPT [ARGS...]")
    parser.set_defaults(func=lambda args: main_raw(args.argv))


def main_raw(argv: list[str]) -> int:
    """Run ``shoal run ARGV`` (everything after ``run``); return the exit status.

    The command line is parsed and checked (flags, values, the script exists and compiles) before
    torch is imported: every argument error is said in a fraction of a second. Raises
    :class:`shoal.errors.ShoalError` for problems the user can fix; the caller prints it.
    """
    from shoal.cli.parser import ArgumentParser
    from shoal.cli.run.args import build_parser

    parser = build_parser(ArgumentParser)
    if asks_for_help(argv):
        parser.print_help()
        return 0
    return run(list(argv), parser)


def run(argv: list[str], parser: argparse.ArgumentParser | None = None) -> int:
    """Run ``shoal run ARGV`` (parsed by ``parser``, default :func:`~shoal.cli.run.args.build_parser`);
    return 0 (a failure raises).

    Raises:
        WorkersFailed: a worker failed (its traceback and the summary are the message), or a signal
            stopped the workers or the launcher.
        ShoalError: bad input (``--nproc 0``, a missing script, a taken port, a bad flag value) or a
            rendezvous that could not complete.
        SystemExit: from torch's parser on unknown flags or ``--help`` (status 2 or 0).
    """
    from shoal.cli.run.args import parse
    from shoal.cli.run.precheck import check_run_args
    from shoal.launch.process import process_started
    from shoal.launch.run import run_script

    started = process_started()
    args, options = parse(argv, parser)
    check_run_args(args)
    return run_script(args, options, started=started)


def asks_for_help(argv: list[str]) -> bool:
    """``-h``/``--help`` among the launcher's leading flags (after the script it is the script's)."""
    for arg in argv:
        if arg in ("-h", "--help"):
            return True
        if not arg.startswith("-"):
            return False
    return False
