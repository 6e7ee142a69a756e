"""``shoal doctor``: check this node, or every node of a cluster, before a job does (docs/DOCTOR.md)."""

from __future__ import annotations

import argparse

from shoal.cli.fields import add_fields, given_fields
from shoal.cli.parser import HelpFormatter

EXAMPLES = """\
examples:
  shoal doctor                                   # this node: versions, GPUs, /dev/shm, limits, disk
  shoal doctor --nproc 8 --master 10.0.0.1:29500 # ... for 8 processes, and the way to the master
  shoal doctor --json                            # the same as one JSON document
  # every node of a cluster, one report from rank 0 (run on each node with its --node-rank):
  shoal doctor --nnodes 4 --node-rank 0 --master-addr 10.0.0.1 --checkpoint-dir /shared/ckpt
  shoal run --nnodes 4 --nproc 8 --rdzv-backend c10d --rdzv-endpoint 10.0.0.1:29400 -m shoal doctor
  srun -N 4 --ntasks-per-node 1 shoal doctor --checkpoint-dir /shared/ckpt
  shoal launch --hosts node1,node2,node3 -- shoal doctor
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``shoal doctor``."""
    from shoal.doctor.settings import DoctorSettings
    from shoal.launch.options import LaunchOptions

    parser = subparsers.add_parser(
        "doctor",
        help="check this node (or every node of a cluster) for what breaks distributed jobs",
        description="One table of checks, each ok / warn / fail with a HINT: versions, GPUs, /dev/shm,\n"
        "open files, the checkpoint directory, launcher variables, the host name, the interface variables\n"
        "and, with --master, the route, name and port of the master. Across nodes (started like any job,\n"
        "or with --nnodes), rank 0 also measures every link between nodes, an all-reduce and shared\n"
        "storage, and prints one report. Exit status 1 on any fail. See docs/DOCTOR.md.",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document (schema in docs/DOCTOR.md)")
    settings = add_fields(parser, DoctorSettings)
    launch = add_fields(
        parser,
        LaunchOptions,
        only=("nproc",),
        help_overrides={"nproc": "Processes the job runs on this node (one per GPU); across nodes: workers to start."},
    )
    nodes = parser.add_argument_group(
        "across nodes", "Run the same command on every node (its own --node-rank); see docs/MULTINODE.md."
    )
    # The watchdog acts on workers that report progress, which the doctor's checks do not: no flags for it.
    launch += add_fields(
        nodes, LaunchOptions, exclude=(*launch, "rdzv_conf", "max_restarts", "hang_timeout", "on_hang")
    )
    parser.set_defaults(func=main_args, settings_fields=settings, launch_fields=launch)


def main_args(args: argparse.Namespace) -> int:
    from shoal.doctor import DoctorSettings, doctor
    from shoal.errors import ShoalError
    from shoal.launch.options import LaunchOptions

    settings = DoctorSettings(**given_fields(args, args.settings_fields))
    given = given_fields(args, args.launch_fields)
    try:
        options = LaunchOptions.from_environment(given)
    except ShoalError:  # bad operator variables: the launcher check names them
        options = LaunchOptions(**given)
    return doctor(settings, options, json_output=args.json)
