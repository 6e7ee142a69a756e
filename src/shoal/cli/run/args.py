"""``shoal run``'s command line: torchrun's flags, parsed without importing torch.

torchrun's flags (``torch.distributed.run.get_args_parser``'s) are frozen in
:mod:`shoal.cli.run.torchrun_flags` so that the command line is parsed, and every argument error
said, before torch is imported; every torchrun flag works in both spellings, and ``PET_*`` variables
give their defaults as for torchrun. What this module adds is shoal's spellings and help where
torchrun's is not true here, shoal's own flags, and the translation of torchrun's arguments into
:class:`~shoal.launch.options.LaunchOptions` (checked once, with the same rules as ``shoal train``).
The launch that follows is :func:`shoal.launch.run.run_script`'s. ``python -m shoal.cli.run.args``
writes the frozen flags again from the installed torch.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from shoal.console import help_text
from shoal.env.operator import classic_defaults, classic_pod, nproc_from
from shoal.errors import ShoalError
from shoal.launch.options import DEFAULT_JOIN_TIMEOUT_S, LaunchOptions, check_join_timeout, parse_conf, parse_nnodes
from shoal.launch.watchdog import ON_HANG, hang_options

DESCRIPTION = """\
Launch SCRIPT as N worker processes per node: a drop-in for torchrun (every torchrun flag works, in
both spellings), run by torch's own elastic agent. What shoal adds:
  - one node and no --master-port/--rdzv-endpoint: a free port is picked (jobs never collide);
  - every socket of the job listens on loopback (one node) or on the interface that leads to the
    other nodes, never on every interface (torch's stores have no authentication);
  - a given port that is already taken on this machine is an immediate error;
  - OMP_NUM_THREADS, unless set, = usable cores // workers per node (torchrun: always 1), or
    // every node's workers when a loopback --master-addr puts all the nodes on this machine;
  - when a worker fails, its own traceback is shown and shoal exits with its exit code;
  - across nodes: the interface and address that route to the master are found and used
    (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, --local-addr, c10d is_host) unless you set them,
    and every node gives up after --join-timeout with the reason;
  - in a Kubeflow pod, the operator's PET_* variables give the defaults, as for torchrun;
    --nproc-per-node auto is one worker per GPU, or one without GPUs;
  - in a pod with only MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE > 1 (Run:ai, training-operator
    before 1.7): node RANK of WORLD_SIZE meeting on MASTER_ADDR:MASTER_PORT, one worker per GPU;
  - started as one rank of a larger job (srun, mpirun, torchrun) or in an allocation of more tasks
    than it starts, with no rendezvous given: an error, never a job of its own per copy;
  - a script that reports its progress (`progress = shoal.init().progress()`) is watched: a hang is
    reported with every rank's phase and source line (--hang-timeout, --on-hang), a straggler is
    named, and `shoal status` shows each rank live (docs/WATCHDOG.md)."""

EXAMPLES = """\
examples:
  shoal run --nproc 2 train.py --lr 0.1          # 2 workers on this machine, free port
  shoal run --nproc-per-node 4 -m mypkg.train    # run a module, like python -m
  OMP_NUM_THREADS=4 shoal run --nproc 2 train.py # your thread count wins
  shoal run --nproc 2 --log-dir run1 train.py    # keep the run directory (logs; shoal status run1)
  # two nodes, static rendezvous (run on each node with its --node-rank):
  shoal run --nnodes 2 --node-rank 0 --nproc 4 --master-addr 10.0.0.1 --master-port 29500 train.py
  # two to four nodes, c10d (the same line on every node; 10.0.0.1 hosts the store):
  shoal run --nnodes 2:4 --nproc 4 --rdzv-backend c10d --rdzv-endpoint 10.0.0.1:29400 \\
      --max-restarts 3 train.py
  shoal run --nproc 2 -m shoal demo all-reduce   # check that collectives work
  shoal run --nproc 2 --hang-timeout 60 --on-hang stop train.py   # fail, with the report, on a hang
  shoal status                                   # from another terminal: where each rank is
"""


USAGE = "shoal run [--nproc N] [--nnodes N|MIN:MAX] [flags] SCRIPT|-m MODULE [ARGS...]"
NO_SCRIPT = (
    "no script given: shoal run starts SCRIPT (or -m MODULE) as N workers",
    "put the script after the flags, e.g. `shoal run --nproc 2 train.py --lr 0.1` (see `shoal run --help`)",
)
"""What ``shoal run`` with flags and no script says (argparse: ``training_script`` is required)."""

_HELP = {
    "nproc_per_node": "workers on this node: a number, or auto/gpu (one per visible GPU, or one without GPUs)",
    "nnodes": "number of nodes: N, or MIN:MAX for an elastic job (with --rdzv-backend c10d)",
    "rdzv_backend": "rendezvous: static (fixed node ranks; the default) or c10d (nodes join in any order; "
    "elastic); etcd is torchrun's alone",
    "master_addr": "several nodes, static rendezvous: the address of node rank 0, where the store listens "
    "(one node: loopback, whatever is given)",
    "master_port": "several nodes, static rendezvous: the store's port on node rank 0 (default 29500); one "
    "node: the port to use (default: a free one, picked by shoal)",
    "local_addr": "this node's address as the other nodes reach it (default: found from the route to the "
    "master, with the interface that leads there)",
    "log_dir": "the run directory, kept after the run: every worker's stdout/stderr logs, torch's agent.log, "
    "progress/ (what `shoal status DIR` reads) and hang reports (default: a temporary shoal-run-* "
    "directory, which `shoal status` finds while the run lives, removed at its end)",
}
"""shoal's help for the torchrun flags whose torchrun help is not true of ``shoal run``."""
_ALIASES = {"nproc_per_node": (("--nproc",), ()), "nnodes": ((), ("--nodes",))}
"""Spellings ``shoal run`` adds before and after torchrun's: shoal's own ``--nproc`` (first: the one
every shoal command shares), Slurm's ``--nodes``."""
LEFT_OUT = {"print_completion": "prints a completion script for torchrun's command line, not shoal's"}
"""torchrun flags ``shoal run`` does not take, and why (``tests/cli/test_help.py`` checks the rest
are torchrun's as installed)."""


class _Env(argparse.Action):
    """torch's ``env`` action (``torch.distributed.argparse_util``, which imports torch): the default
    comes from ``PET_<DEST>`` when that is set, as for torchrun."""

    def __init__(self, option_strings, dest, default=None, required=False, **kwargs):
        default = os.environ.get(f"PET_{dest.upper()}", default)
        super().__init__(option_strings, dest, default=default, required=required and not default, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)


class _CheckEnv(argparse.Action):
    """torch's ``check_env``: a switch, on by default when ``PET_<DEST>`` is a non-zero number."""

    def __init__(self, option_strings, dest, default=False, **kwargs):
        default = bool(int(os.environ.get(f"PET_{dest.upper()}", "1" if default else "0")))
        super().__init__(option_strings, dest, nargs=0, const=True, default=default, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, self.const)


class _Nproc(_Env):
    """``--nproc``/``--nproc-per-node``: checked as given (named as typed), and two spellings that
    disagree are an error rather than the last one winning."""

    def __call__(self, parser, namespace, values, option_string=None):
        check_nproc_text(values, option_string or "--nproc")
        earlier = getattr(namespace, "nproc_given", None)
        if earlier and earlier[0] != option_string and earlier[1] != values:
            raise ShoalError(
                f"{earlier[0]} {earlier[1]} and {option_string} {values} disagree",
                "give only one of them (--nproc-per-node is another spelling of --nproc)",
            )
        namespace.nproc_given = (option_string, values)
        setattr(namespace, self.dest, values)


def check_nproc_text(text: str, flag: str) -> None:
    """A worker count as typed: a whole number of at least 1, ``auto`` or ``gpu``."""
    value = str(text).strip().lower()
    if value.lstrip("-").isdigit():
        if int(value) < 1:
            raise ShoalError(f"{flag} must be at least 1, got {value}", "give the number of worker processes, e.g. 2")
    elif value not in ("auto", "gpu"):
        raise ShoalError(
            f"{flag} {text!r} is neither a number of processes nor auto/gpu",
            f"give the number of worker processes, e.g. {flag} 2, or {flag} auto (one per GPU)",
        )


def _nnodes(text: str) -> str:
    try:
        parse_nnodes(text)
    except ShoalError:
        raise argparse.ArgumentTypeError(f"{text!r} is not N or MIN:MAX (1 <= MIN <= MAX)") from None
    return text


def _comma_list(text: str) -> list[str]:
    """torchrun's ``comma_separated_list``: ``a,b`` -> ["a", "b"]; ``,,`` is an escaped comma."""
    placeholder = "<COMMA_PLACEHOLDER>"
    return [item.replace(placeholder, ",") for item in text.replace(",,", placeholder).split(",")]


_TYPES = {"str": str, "int": int, "float": float, "list": _comma_list}
_ACTIONS = {"env": _Env, "check_env": _CheckEnv, "store": "store"}


def build_parser(parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``shoal run``'s parser, torch-free: torchrun's flags as installed torch declares them (frozen in
    :mod:`shoal.cli.run.torchrun_flags`, checked against torch's parser by ``tests/cli/test_help.py``),
    with shoal's help where torchrun's is not true here, shoal's spellings, and shoal's additions.
    ``parser_class``: the CLI's (its one-line errors and help style)."""
    from shoal.cli.run.torchrun_flags import FLAGS

    parser = parser_class(
        prog="shoal run",
        usage=USAGE,
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.required_messages = {"SCRIPT": NO_SCRIPT}  # type: ignore[attr-defined]
    torchrun = parser.add_argument_group("torchrun's flags (both spellings: --nproc-per-node, --nproc_per_node)")
    for names, dest, action, kind, default, choices, torch_help in FLAGS:
        if dest in LEFT_OUT:
            continue
        options: dict = {"dest": dest, "default": default, "help": help_text(_HELP.get(dest, torch_help))}
        options["action"] = _Nproc if dest == "nproc_per_node" else _ACTIONS[action]
        if action != "check_env":
            options["type"] = _nnodes if dest == "nnodes" else _TYPES[kind]
            options["metavar"] = ("|".join(choices) if len(choices) < 4 else "MODE") if choices else _metavar(dest)
        if choices:
            options["choices"] = choices
            if options["metavar"] == "MODE":
                options["help"] += f" (one of: {', '.join(choices)})"
        torchrun.add_argument(*_spellings(dest, names), **options)
    group = parser.add_argument_group("shoal additions")
    group.add_argument(
        "--join-timeout",
        type=float,
        default=DEFAULT_JOIN_TIMEOUT_S,
        metavar="S",
        help=f"several nodes: fail when they have not all arrived after S seconds (default {DEFAULT_JOIN_TIMEOUT_S:g})",
    )
    group.add_argument(
        "--hang-timeout",
        metavar="S",
        default=None,
        help="report a hang when no rank made progress for S seconds (default: 10 x the step time, at "
        "least 30; only for scripts that report progress: docs/WATCHDOG.md)",
    )
    group.add_argument(
        "--on-hang",
        choices=ON_HANG,
        default="report",
        help="after a hang report: only report (default), stop the workers and fail, or restart them "
        "(counts against --max-restarts)",
    )
    group.add_argument(
        "--tf-config",
        action="store_true",
        help="give each worker TF_CONFIG for TensorFlow's MultiWorkerMirroredStrategy (every worker's "
        "address and a port it reserved, its index = RANK); the same as SHOAL_TF_CONFIG=1",
    )
    group.add_argument(
        "--horovod-shim",
        action="store_true",
        help="let a script keep `import horovod...` (Horovod's names load shoal.horovod's, from the shoal "
        "installed where each worker runs); the same as SHOAL_HOROVOD_SHIM=1",
    )
    group.add_argument("--verbose", action="store_true", help="show torch's elastic agent logs too")
    parser.add_argument("training_script", metavar="SCRIPT", help="the script (or, with -m, the module) to run")
    script_args = parser.add_argument("training_script_args", nargs=argparse.REMAINDER, metavar="ARGS")
    script_args.help = "the script's own arguments"
    script_args.required = False  # only SCRIPT is reported missing
    return parser


def _spellings(dest: str, names: tuple[str, ...]) -> tuple[str, ...]:
    before, after = _ALIASES.get(dest, ((), ()))
    return (*before, *names, *after)


def _metavar(dest: str) -> str:
    return {
        "nproc_per_node": "N", "nnodes": "N|MIN:MAX", "node_rank": "R", "master_addr": "ADDR", "master_port": "PORT",
        "local_addr": "ADDR", "rdzv_endpoint": "HOST:PORT", "rdzv_id": "ID", "rdzv_conf": "K=V,...",
        "max_restarts": "K", "monitor_interval": "S", "shutdown_timeout": "S", "log_dir": "DIR",
        "rdzv_backend": "static|c10d", "event_log_handler": "NAME", "log_line_prefix_template": "TEMPLATE",
        "local_ranks_filter": "RANKS", "duplicate_stdout_filters": "FILTERS", "duplicate_stderr_filters": "FILTERS",
        "logs_specs": "NAME", "signals_to_handle": "SIGNALS",
    }.get(dest, dest.upper())  # fmt: skip


def parse(
    argv: list[str], parser: argparse.ArgumentParser | None = None, environ: Mapping[str, str] | None = None
) -> tuple[argparse.Namespace, LaunchOptions]:
    """torchrun's arguments and the LaunchOptions they give. In a pod with only the classic variables
    (:func:`~shoal.env.operator.classic_pod`) those are the flags' defaults, as PET_* are torchrun's:
    flags given win."""
    parser = parser or build_parser()
    environ = os.environ if environ is None else environ
    if classic_pod(environ):
        parser.set_defaults(**_torchrun_defaults(classic_defaults(environ)))
    args = parser.parse_args(argv)
    return args, options_from_args(args)


def _torchrun_defaults(defaults: dict) -> dict:
    """LaunchOptions field values as defaults of torchrun's parser (its ``dest`` names)."""
    names = {"nproc": "nproc_per_node"}
    return {names.get(key, key): str(value) if key == "nproc" else value for key, value in defaults.items()}


def options_from_args(args: argparse.Namespace) -> LaunchOptions:
    """torchrun's arguments as LaunchOptions (``--standalone``: this machine only)."""
    flag = getattr(args, "nproc_given", ("--nproc",))[0]  # as typed (_Nproc)
    nproc = nproc_from(str(args.nproc_per_node), flag)
    _, max_nodes = parse_nnodes(args.nnodes)
    check_join_timeout(args.join_timeout)
    if args.rdzv_backend not in ("static", "c10d"):
        raise ShoalError(
            f"--rdzv-backend {args.rdzv_backend}: shoal run supports the static and c10d rendezvous",
            "use --rdzv-backend c10d (no etcd server needed), or torchrun itself for etcd",
        )
    hang_timeout, on_hang = hang_options(args.hang_timeout, args.on_hang)
    common = dict(
        nproc=nproc, max_restarts=args.max_restarts, join_timeout=args.join_timeout, verbose=args.verbose,
        hang_timeout=hang_timeout, on_hang=on_hang,
    )  # fmt: skip
    # torchrun's --master-addr defaults to 127.0.0.1: one node with no port or endpoint of its own
    # is a standalone job, on a free port.
    if args.standalone or (max_nodes == 1 and args.master_port is None and not args.rdzv_endpoint):
        return LaunchOptions(**common)
    return LaunchOptions(
        **common, nnodes=args.nnodes, node_rank=args.node_rank, master_addr=args.master_addr,
        master_port=args.master_port, rdzv_backend=args.rdzv_backend, rdzv_endpoint=args.rdzv_endpoint or None,
        rdzv_id=args.rdzv_id, local_addr=args.local_addr, rdzv_conf=parse_conf(args.rdzv_conf),
    )  # fmt: skip


_FROZEN_DOC = '''"""torchrun's flags as the installed torch declares them, frozen so that ``shoal run`` parses its
command line without importing torch (2-3 s of CPU before any error or ``--help``). Generated: do
not edit; write it again with ``python -m shoal.cli.run.args``.

One row per flag: (spellings, dest, action, type, default, choices, torchrun's help). ``action``:
``env`` (the default comes from ``PET_<DEST>``, as torchrun's), ``check_env`` (a switch, on when
``PET_<DEST>`` is a non-zero number) or ``store``; ``type``: ``str``, ``int``, ``float`` or ``list``
(comma-separated). :func:`shoal.cli.run.args.build_parser` builds ``shoal run``'s parser from them;
``tests/cli/test_help.py`` fails when torch's parser says something else (a torch release that adds,
drops or changes a flag).
"""
'''


def torchrun_flags() -> tuple[tuple, ...]:
    """The rows of :data:`shoal.cli.run.torchrun_flags.FLAGS`, read from the installed torch's torchrun parser."""
    from torch.distributed.run import get_args_parser

    rows = []
    for action in get_args_parser()._actions:
        if not action.option_strings or action.dest == "help":
            continue
        kind = {"env": "env", "check_env": "check_env", "_StoreAction": "store"}.get(type(action).__name__, "other")
        type_name = getattr(action.type, "__name__", None)
        type_name = {"comma_separated_list": "list"}.get(type_name, type_name)
        choices = tuple(action.choices) if action.choices is not None else None
        default = None if kind == "other" else _default_without_environment(action)
        rows.append((tuple(action.option_strings), action.dest, kind, type_name, default, choices, action.help))
    return tuple(rows)


def _default_without_environment(action: argparse.Action):
    """A flag's default as torch declares it, not as this process's ``PET_*`` variables made it."""
    if f"PET_{action.dest.upper()}" in os.environ:
        raise RuntimeError(f"unset PET_{action.dest.upper()} to write the frozen flags")
    return action.default


def frozen_flags_source(rows: tuple[tuple, ...]) -> str:
    """The source of :mod:`shoal.cli.run.torchrun_flags` holding ``rows``."""
    lines = "".join(f"    {row!r},\n" for row in rows)
    return f"{_FROZEN_DOC}\n# fmt: off\nFLAGS = (\n{lines})\n# fmt: on\n"


if __name__ == "__main__":  # write shoal/cli/run/torchrun_flags.py from the installed torch's parser
    import pathlib

    target = pathlib.Path(__file__).with_name("torchrun_flags.py")
    target.write_text(frozen_flags_source(torchrun_flags()))
    print(f"wrote {target}")
