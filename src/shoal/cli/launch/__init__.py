"""``shoal launch``: start a job on many machines from one command.

Each form builds one :class:`~shoal.jobs.spec.JobSpec` and its target's options, and hands them to
that target's module in :mod:`shoal.jobs` (render, then submit); ``--dry-run`` prints what would run
instead of running it:

- ``shoal launch --hosts node1:2,node2:2 -- COMMAND``: from the head node, through Open MPI's
  mpirun when it is installed (one process per slot), else through SSH (one ``shoal run`` per host);
- ``shoal launch mpirun -np N [--hosts ...] -- COMMAND``: the mpirun command line;
- ``shoal launch slurm --nodes N ... -- COMMAND``: an sbatch script, submitted with sbatch;
- ``shoal launch manual --hosts ... -- COMMAND``: the ``shoal run`` line to type on each node;
- ``shoal launch k8s --kind pytorchjob|trainjob|mpijob ... -- COMMAND``: a Kubeflow object, applied;
- ``shoal launch runai ... -- COMMAND``: the Run:ai submit command of each CLI generation;
- ``shoal launch image -- COMMAND``: a Dockerfile and .dockerignore for the job's image.

The arguments are parsed here rather than by ``shoal``'s top-level parser (whose subcommand
positional cannot coexist with options before a ``--``): :func:`register` only adds ``launch`` to
``shoal --help`` and hands the raw arguments to :func:`main_raw`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from shoal.cli.launch import hosts, k8s, slurm
from shoal.cli.launch.common import command
from shoal.errors import ShoalError

HELP = "start a job on many machines: mpirun, SSH, Slurm, Kubernetes (Kubeflow, Run:ai), or by hand"

_FORMS = {
    "hosts": (hosts.hosts_parser, hosts.run_hosts),
    "mpirun": (hosts.mpirun_parser, hosts.run_mpirun),
    "manual": (hosts.manual_parser, hosts.run_manual),
    "slurm": (slurm.slurm_parser, slurm.run_slurm),
    "k8s": (k8s.k8s_parser, k8s.run_k8s),
    "runai": (k8s.runai_parser, k8s.run_runai),
    "image": (k8s.image_parser, k8s.run_image),
}


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``launch`` to ``shoal``; its arguments reach :func:`main_raw` untouched."""
    parser = subparsers.add_parser(
        "launch",
        help=HELP,
        description=HELP,
        add_help=False,
        # No option prefix: every argument, ``--hosts`` and ``--`` included, is collected as is.
        prefix_chars="\x00",
    )
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    parser.set_defaults(func=lambda args: main_raw(args.argv))
    return parser


def main_raw(argv: Sequence[str]) -> int:
    """Run ``shoal launch ARGV``; return the exit status. ShoalError for bad input."""
    argv = list(argv)
    form = argv[0] if argv and argv[0] in _FORMS and argv[0] != "hosts" else "hosts"
    if form != "hosts":
        argv = argv[1:]
    build_parser, run = _FORMS[form]
    args = build_parser().parse_args(argv)
    args.command = command(args.command)
    return run(args)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m shoal.cli.launch ...``: this command alone, errors printed as ``shoal`` prints them."""
    try:
        return main_raw(sys.argv[1:] if argv is None else argv)
    except ShoalError as err:
        print(err.format(), file=sys.stderr, flush=True)
        return err.exit_code
