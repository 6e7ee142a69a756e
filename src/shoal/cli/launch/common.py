"""What every ``shoal launch`` form shares: parser construction, the command after ``--``, output."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import textwrap
from collections.abc import Sequence

from shoal.atomic import atomic_write_text
from shoal.errors import ShoalError

EXAMPLES = """\
examples:
  shoal launch --hosts node1:2,node2:2 -- shoal train digits     # mpirun if installed, else SSH
  shoal launch --hosts node1:4,node2:4 --via ssh -- train.py --lr 0.1
  shoal launch --hostfile hosts.txt --dry-run -- train.py         # print the command, run nothing
  shoal launch mpirun -np 4 --hosts node1:2,node2:2 --dry-run -- shoal train digits
  shoal launch slurm --nnodes 2 --gpus-per-node 4 -t 1:00:00 -- shoal train cifar10 --data ~/data
  shoal launch slurm --nnodes 2 --nproc 4 --one-task-per-process --dry-run -- train.py
  shoal launch slurm -p gpu --nnodes 4 --gpus-per-node 8 --max-restarts 2 -- train.py --epochs 90
  shoal launch slurm --nnodes 4 --spare-nodes 1 -- shoal train digits --fault-tolerance --out ft
  shoal launch manual --hosts node1:4,node2:4 -- train.py         # the line to type on each node
  shoal launch k8s --kind pytorchjob --image IMG --nnodes 2 -g 4 --dry-run -- shoal train mnist
  shoal launch runai --image IMG --nnodes 2 -g 1 -- train.py      # runai submit, each CLI generation
  shoal launch image -- train.py --lr 0.1                         # Dockerfile + .dockerignore

COMMAND is what every process runs: `shoal train ...`, `SCRIPT.py ARGS`, `-m MODULE ARGS`, or a
program. See docs/LAUNCHERS.md and docs/KUBERNETES.md for copy-paste commands."""


def form_examples(prog: str) -> str:
    """The examples of one form (``shoal launch slurm``: its lines of :data:`EXAMPLES`); every
    example for ``shoal launch`` itself, whose help introduces them all."""
    head, _, tail = EXAMPLES.partition("\n\nCOMMAND")
    lines = head.splitlines()
    if prog != "shoal launch":
        lines = lines[:1] + [line for line in lines[1:] if line.startswith(f"  {prog} ")]
    return "\n".join(lines) + "\n\nCOMMAND" + tail


def parser(prog: str, description: str, epilog: str | None = None) -> argparse.ArgumentParser:
    """A ``shoal launch`` form's parser: a bad option is one line and a HINT, not argparse's usage
    block. ``epilog``: default, the form's lines of :data:`EXAMPLES`."""
    from shoal.cli.parser import HELP_WIDTH, ArgumentParser

    return ArgumentParser(
        prog=prog,
        description=textwrap.fill(description, HELP_WIDTH),
        epilog=form_examples(prog) if epilog is None else epilog,
    )


def add_env(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--env",
        action="append",
        metavar="NAME[=VALUE]",
        help="pass this variable to every process (repeatable; NAME alone: its value here)",
    )
    p.add_argument(
        "--horovod-shim",
        action="store_true",
        help="let a script keep `import horovod...`: Horovod's names load shoal.horovod's, from the shoal "
        "installed where each process runs (every process gets SHOAL_HOROVOD_SHIM=1)",
    )


HOROVOD_SHIM_ITEM = "SHOAL_HOROVOD_SHIM=1"


def env_items(args: argparse.Namespace) -> list[str]:
    """``--env`` as given, with ``--horovod-shim``'s variable."""
    return [*(getattr(args, "env", None) or ()), *([HOROVOD_SHIM_ITEM] if getattr(args, "horovod_shim", False) else [])]


def warn_local_paths(env, environ, *, where: str, shared_files: bool = False, label: str = "--env {name}") -> None:
    """A warning line for each ``--env`` variable whose value holds a path of this machine that
    ``where`` (pods, other nodes) may not have: one in this Python's installation (its virtual
    environment, site-packages) or home directory. A path to the Horovod shim names ``--horovod-shim``,
    which finds the shim where each process runs. ``shared_files``: the target runs this Python by
    its path already (Slurm, a host list), so only the shim's path is said. ``env``: (name, value or
    None for this shell's), as :class:`~shoal.jobs.spec.JobSpec` holds it; ``label``: how the line
    names a variable (``--env {name}``, or one passed on from this shell unasked)."""
    from shoal.launch.exit_hook import HOROVOD_SHIM_DIRECTORY

    shim_dir = os.path.realpath(HOROVOD_SHIM_DIRECTORY)
    roots = [os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, os.path.expanduser("~"))]
    roots = [root for root in roots if root != os.sep]
    for name, value in env:
        value = environ.get(name, "") if value is None else value
        parts = [os.path.realpath(part) for part in value.split(os.pathsep) if os.path.isabs(part)]
        local = [part for part in parts if os.path.exists(part)]
        if shared_files:
            local = [part for part in local if part == shim_dir]
        else:
            local = [p for p in local if p == shim_dir or any(p == r or p.startswith(r + os.sep) for r in roots)]
        if not local:
            continue
        advice = (
            "pass --horovod-shim instead: it finds the shim where each process runs"
            if shim_dir in local
            else "give the path it has there"
        )
        print(
            f"shoal launch: warning: {label.format(name=name)} passes this machine's {local[0]} to {where}, where it exists "
            f"only if the files there match this machine's; {advice}",
            file=sys.stderr,
            flush=True,
        )


def add_command(p: argparse.ArgumentParser, *, dry_run: str = "print what would run, run nothing") -> None:
    p.add_argument("--dry-run", action="store_true", help=dry_run)
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND",
        help="what every process runs: shoal train ..., SCRIPT.py ARGS, -m MODULE ARGS, PROGRAM",
    )


def add_python(p: argparse.ArgumentParser, where: str) -> None:
    """``--python PATH``: the interpreter that runs shoal, SCRIPT.py and -m MODULE on ``where``."""
    p.add_argument("--python", metavar="PATH", help=f"interpreter that runs shoal, SCRIPT.py and -m MODULE on {where}")


def add_nodes(p: argparse.ArgumentParser, help_text: str) -> None:
    """``--nnodes N``, the number of nodes as every shoal command spells it (torchrun's); Slurm's
    ``--nodes`` is the same flag."""
    p.add_argument("--nnodes", "--nodes", dest="nodes", type=_at_least_one, default=1, metavar="N", help=help_text)


def add_nproc(p: argparse.ArgumentParser, help_text: str, *, auto: bool = False, **options) -> None:
    """``--nproc N``, processes per node as every shoal command spells it; torchrun's
    ``--nproc-per-node`` is the same flag. ``auto``: the word ``auto`` is a value too."""
    options.setdefault("metavar", "N|auto" if auto else "N")
    options["type"] = _nproc_or_auto if auto else _at_least_one
    p.add_argument("--nproc", "--nproc-per-node", dest="nproc", help=help_text, **options)


def _at_least_one(text: str) -> int:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    if int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return int(text)


def _nproc_or_auto(text: str) -> int | str:
    if text == "auto":
        return text
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a whole number of at least 1 nor auto")
    return int(text)


def add_max_restarts(p: argparse.ArgumentParser, help_text: str) -> None:
    p.add_argument("--max-restarts", type=int, default=0, metavar="K", help=help_text)


def command(words: list[str]) -> tuple[str, ...]:
    if words and words[0] == "--":
        words = words[1:]
    if not words:
        raise ShoalError(
            "no command given", "put the command after --, e.g. `-- shoal train digits` or `-- train.py --lr 0.1`"
        )
    return tuple(words)


def script_of(words: Sequence[str]) -> str | None:
    """The Python script a job's command runs (``train.py ...``, ``python train.py ...``), if any."""
    if words and os.path.basename(words[0]).startswith("python") and len(words) > 1:
        words = words[1:]
    return words[0] if words and words[0].endswith(".py") else None


def warn_missing_script(words: Sequence[str], workdir: str | None = None, *, where: str = "every node") -> None:
    """A warning line when the command's script does not exist here (relative to ``workdir``, the
    job's working directory, when given): a rendered job would fail on every process, later."""
    script = script_of(words)
    if script is None:
        return
    path = os.path.join(os.path.expanduser(workdir), script) if workdir else script
    if not os.path.exists(path):
        shown = f"{script} (in {workdir})" if workdir else f"{script} (working directory {os.getcwd()})"
        print(
            f"shoal launch: warning: {shown} does not exist here; every process will fail unless {where} holds it",
            file=sys.stderr,
            flush=True,
        )


def check_replaceable(path: str, marker: str, *, what: str) -> None:
    """Raise unless ``path`` is absent or was rendered by shoal (its head holds ``marker``)."""
    if os.path.exists(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            head = f.read(4096)
        if marker not in head:
            raise ShoalError(
                f"{path} exists and was not written by {what}",
                "give another file name, or move the file away",
            )


def write_rendered(path: str, text: str, marker: str, *, what: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` atomically; an existing file is replaced only if shoal rendered it."""
    check_replaceable(path, marker, what=what)
    atomic_write_text(path, text, mode=mode)


def announce(line: str) -> None:
    print(f"shoal launch: {line}", file=sys.stderr, flush=True)


def shell(argv: Sequence[str]) -> str:
    return shlex.join(argv)
