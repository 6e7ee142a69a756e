"""``shoal launch``: start a job on many machines from one command.

Four forms, each building one :class:`~shoal.launch.spec.JobSpec` and handing it to a renderer
(:mod:`shoal.launch.render`); ``--dry-run`` prints what would run instead of running it:

- ``shoal launch --hosts node1:2,node2:2 -- COMMAND``: from the head node, through Open MPI's
  mpirun when it is installed (one process per slot), else through SSH (one ``shoal run`` per host);
- ``shoal launch mpirun -np N [--hosts ...] -- COMMAND``: the mpirun command line;
- ``shoal launch slurm --nodes N ... -- COMMAND``: an sbatch script, submitted with sbatch;
- ``shoal launch manual --hosts ... -- COMMAND``: the ``shoal run`` line to type on each node.

The arguments are parsed here rather than by ``shoal``'s top-level parser (whose subcommand
positional cannot coexist with options before a ``--``): :func:`register` only adds ``launch`` to
``shoal --help`` and hands the raw arguments to :func:`main_raw`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import textwrap
from collections.abc import Sequence

from shoal.errors import ShoalError

HELP = "start a job on many machines: over mpirun or SSH, as a Slurm batch job, or by hand"

EXAMPLES = """\
examples:
  shoal launch --hosts node1:2,node2:2 -- shoal train digits     # mpirun if installed, else SSH
  shoal launch --hosts node1:4,node2:4 --via ssh -- train.py --lr 0.1
  shoal launch --hostfile hosts.txt --dry-run -- train.py         # print the command, run nothing
  shoal launch mpirun -np 4 --hosts node1:2,node2:2 --dry-run -- shoal train digits
  shoal launch slurm --nodes 2 --gpus-per-node 4 --time 1:00:00 -- shoal train cifar10 --data ~/data
  shoal launch slurm --nodes 2 --nproc-per-node 4 --one-task-per-process --dry-run -- train.py
  shoal launch manual --hosts node1:4,node2:4 -- train.py         # the line to type on each node

COMMAND is what every process runs: `shoal train ...`, `SCRIPT.py ARGS`, `-m MODULE ARGS`, or a
program. See docs/LAUNCHERS.md for every launcher with copy-paste commands."""

_FORMS = ("mpirun", "slurm", "manual")


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
    form = argv[0] if argv and argv[0] in _FORMS else "hosts"
    if form != "hosts":
        argv = argv[1:]
    parser = _PARSERS[form]()
    args = parser.parse_args(argv)
    args.command = _command(args.command)
    return _RUNNERS[form](args)


# ---- parsers ---------------------------------------------------------------------------------


def _parser(prog: str, description: str, epilog: str = EXAMPLES) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog=prog,
        description=textwrap.fill(description, 100),
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _add_common(p: argparse.ArgumentParser, *, addr: bool = True) -> None:
    if addr:
        p.add_argument(
            "--master-addr", metavar="ADDR", help="rendezvous host as the others reach it (default: the first host)"
        )
    p.add_argument(
        "--master-port",
        type=int,
        metavar="PORT",
        help="rendezvous port (default 29500; a free one when the rendezvous host is this machine)",
    )
    p.add_argument(
        "--env",
        action="append",
        metavar="NAME[=VALUE]",
        help="pass this variable to every process (repeatable; NAME alone: its value here)",
    )
    p.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND",
        help="what every process runs: shoal train ..., SCRIPT.py ARGS, -m MODULE ARGS, PROGRAM",
    )


def _add_hosts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hosts", metavar="H:N,...", help="hosts and their slots (processes), e.g. node1:2,node2:2")
    p.add_argument("--hostfile", metavar="FILE", help="Open MPI hostfile: one `HOST slots=N` per line")
    p.add_argument(
        "--nproc-per-node", type=int, default=1, metavar="N", help="slots of a host given without :N (default 1)"
    )


def _add_launcher(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rdzv",
        choices=("static", "c10d"),
        default="static",
        help="per-node launchers' rendezvous: static (node ranks in host order, default) or c10d",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="K",
        help="restart the whole group up to K times after a worker fails",
    )


def _hosts_parser() -> argparse.ArgumentParser:
    p = _parser(
        "shoal launch",
        "Start COMMAND on every slot of the given hosts from this node: through "
        "Open MPI's mpirun when it is installed (one process per slot; each finds its rank in "
        "mpirun's variables), else through SSH (one `shoal run` launcher per host). Other forms: "
        "`shoal launch mpirun|slurm|manual --help`.",
    )
    _add_hosts(p)
    p.add_argument(
        "--via",
        choices=("auto", "mpirun", "ssh"),
        default="auto",
        help="auto (default): mpirun if it is on PATH, else ssh",
    )
    p.add_argument("--rsh", metavar="PROGRAM", help="how to reach another host (default ssh; mpirun's plm_rsh_agent)")
    _add_launcher(p)
    _add_common(p)
    return p


def _mpirun_parser() -> argparse.ArgumentParser:
    p = _parser(
        "shoal launch mpirun",
        "Run COMMAND as N processes with Open MPI's mpirun, with the flags "
        "a multi-node PyTorch job needs (rendezvous address exported, no core binding, TCP).",
    )
    p.add_argument(
        "-np", "-n", "--np", dest="np", type=int, metavar="N", help="processes (default: the hosts' slots added up)"
    )
    _add_hosts(p)
    p.add_argument("--rsh", metavar="PROGRAM", help="how mpirun reaches another host (plm_rsh_agent)")
    _add_common(p)
    return p


def _slurm_parser() -> argparse.ArgumentParser:
    p = _parser(
        "shoal launch slurm",
        "Render an sbatch script (one `shoal run` launcher per node, c10d "
        "rendezvous on the allocation's first node; or srun starting every process with "
        "--one-task-per-process), write it and submit it with sbatch; print the job id.",
    )
    p.add_argument("--nodes", type=int, default=1, metavar="N", help="nodes to allocate (default 1)")
    p.add_argument("--gpus-per-node", type=int, default=0, metavar="G", help="GPUs per node (default 0)")
    p.add_argument(
        "--nproc-per-node", type=int, metavar="P", help="processes per node (default: --gpus-per-node, or 1)"
    )
    p.add_argument("--cpus-per-node", type=int, metavar="C", help="cores per node (default: one per process)")
    p.add_argument("--partition", "-p", help="Slurm partition")
    p.add_argument("--time", "-t", dest="time_limit", metavar="LIMIT", help="time limit, e.g. 1:00:00")
    p.add_argument("--job-name", "-J", default="shoal", help="job name (default shoal)")
    p.add_argument("--output", "-o", default="shoal-%j.out", help="output file (default shoal-%%j.out)")
    p.add_argument("--error", "-e", help="stderr file (default: with the output)")
    p.add_argument("--chdir", "-D", dest="workdir", metavar="DIR", help="working directory of the job")
    p.add_argument(
        "--one-task-per-process",
        action="store_true",
        help="srun starts every process (shoal detects Slurm) instead of one launcher per node",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="K",
        help="launchers restart the group up to K times after a worker fails",
    )
    p.add_argument("--script", metavar="FILE", help="where to write the script (default JOB_NAME.sbatch)")
    _add_common(p, addr=False)
    return p


def _manual_parser() -> argparse.ArgumentParser:
    p = _parser(
        "shoal launch manual",
        "Print the `shoal run` command line to type on each host, in "
        "node-rank order (the first host serves the rendezvous).",
    )
    _add_hosts(p)
    _add_launcher(p)
    _add_common(p)
    return p


_PARSERS = {"hosts": _hosts_parser, "mpirun": _mpirun_parser, "slurm": _slurm_parser, "manual": _manual_parser}


# ---- runners ---------------------------------------------------------------------------------


def _run_hosts(args: argparse.Namespace) -> int:
    from shoal.launch import remote
    from shoal.launch.render import render_mpirun, render_ssh
    from shoal.launch.spec import Here, JobSpec, forwarded_env, parse_env

    hosts = _hosts(args, required=True)
    via = args.via
    if via == "auto":
        via = "mpirun" if shutil.which("mpirun") else "ssh"
    here = Here.detect(hosts)
    common = dict(
        command=args.command,
        hosts=hosts,
        master_addr=args.master_addr,
        master_port=_port(args, hosts, here),
        env=forwarded_env(os.environ, parse_env(args.env)),
        rsh=args.rsh,
    )
    if via == "mpirun":
        if args.rdzv != "static" or args.max_restarts:
            raise ShoalError(
                "--rdzv and --max-restarts apply to per-node launchers, not to mpirun",
                "add --via ssh, or drop them (mpirun starts the processes itself)",
            )
        spec = JobSpec(**common, hostfile=args.hostfile)
        argv = render_mpirun(spec, here)
        if args.dry_run:
            print(_shell(argv))
            return 0
        _announce(
            f"mpirun, {_count(spec.world_size, 'process')} on {_host_list(spec)}, rendezvous "
            f"{spec.main_address()}:{spec.port()}"
        )
        return remote.run_mpirun(argv)
    spec = JobSpec(
        **common,
        rdzv=args.rdzv,
        max_restarts=args.max_restarts,
        workdir=os.getcwd(),
        shoal=(sys.executable, "-m", "shoal"),
    )
    commands = render_ssh(spec, here, os.environ)
    if args.dry_run:
        for host, cmd in zip(spec.hosts, commands, strict=True):
            print(f"# {host}")
            print(_shell(cmd))
        return 0
    local = sum(here.is_local(h.name) for h in spec.hosts)
    parts = [f"{local} here"] if local else []
    if len(commands) > local:
        parts.append(f"{len(commands) - local} over {args.rsh or 'ssh'}")
    how = ", ".join(parts)
    _announce(
        f"{_count(len(commands), 'launcher')} ({how}), {_count(spec.world_size, 'process')} on "
        f"{_host_list(spec)}, {spec.rdzv} rendezvous {spec.main_address()}:{spec.port()}"
    )
    return remote.run_launchers(commands, [f"host {h.name} (node {i})" for i, h in enumerate(spec.hosts)])


def _run_mpirun(args: argparse.Namespace) -> int:
    from shoal.launch import remote
    from shoal.launch.render import render_mpirun
    from shoal.launch.spec import Here, JobSpec, forwarded_env, parse_env

    hosts = _hosts(args, required=False)
    if args.np is None and not hosts:
        raise ShoalError("no process count", "give -np N (and --hosts for several machines)")
    here = Here.detect(hosts)
    if not hosts and not args.master_addr and os.environ.get("SLURM_JOB_NODELIST"):
        # Inside a Slurm allocation mpirun spreads the ranks over its nodes; rank 0 runs on the first.
        from shoal.env.hostlist import expand_hostlist

        try:
            args.master_addr = expand_hostlist(os.environ["SLURM_JOB_NODELIST"])[0]
        except ValueError as err:
            raise ShoalError(
                f"SLURM_JOB_NODELIST={os.environ['SLURM_JOB_NODELIST']!r} is malformed: {err}",
                "give --master-addr <first node of the allocation>",
            ) from None
    spec = JobSpec(
        command=args.command,
        hosts=hosts,
        hostfile=args.hostfile,
        np=args.np,
        master_addr=args.master_addr,
        master_port=_port(args, hosts, here),
        env=forwarded_env(os.environ, parse_env(args.env)),
        rsh=args.rsh,
    )
    argv = render_mpirun(spec, here)
    if args.dry_run:
        print(_shell(argv))
        return 0
    _announce(f"mpirun, {_count(spec.world_size, 'process')}, rendezvous {spec.main_address()}:{spec.port()}")
    return remote.run_mpirun(argv)


def _run_slurm(args: argparse.Namespace) -> int:
    from shoal.launch import remote
    from shoal.launch.render import SBATCH_MARKER, render_sbatch
    from shoal.launch.spec import JobSpec, parse_env

    nproc = args.nproc_per_node if args.nproc_per_node is not None else max(1, args.gpus_per_node)
    spec = JobSpec(
        command=args.command,
        nodes=args.nodes,
        nproc_per_node=nproc,
        gpus_per_node=args.gpus_per_node,
        cpus_per_node=args.cpus_per_node,
        partition=args.partition,
        time_limit=args.time_limit,
        job_name=args.job_name,
        output=args.output,
        error=args.error,
        workdir=args.workdir,
        one_task_per_process=args.one_task_per_process,
        max_restarts=args.max_restarts,
        master_port=args.master_port,
        env=parse_env(args.env),
    )
    if spec.one_task_per_process and spec.max_restarts:
        raise ShoalError("--max-restarts needs the per-node launchers", "drop --one-task-per-process or --max-restarts")
    script = render_sbatch(spec)
    if args.dry_run:
        sys.stdout.write(script)
        return 0
    path = args.script or f"{spec.job_name}.sbatch"
    remote.require_program("sbatch", "run it on a Slurm login node, or add --dry-run to print the script")
    _write_script(path, script, SBATCH_MARKER)
    job_id = remote.submit_sbatch(path)
    output = spec.output.replace("%j", job_id)
    _announce(f"submitted batch job {job_id} (script {path}, output {output}); watch it with `squeue -j {job_id}`")
    print(job_id, flush=True)
    return 0


def _run_manual(args: argparse.Namespace) -> int:
    from shoal.launch.render import render_manual
    from shoal.launch.spec import JobSpec, parse_env

    spec = JobSpec(
        command=args.command,
        hosts=_hosts(args, required=True),
        master_addr=args.master_addr,
        master_port=args.master_port,
        rdzv=args.rdzv,
        max_restarts=args.max_restarts,
        env=parse_env(args.env),
    )
    for rank, (host, line) in enumerate(zip(spec.hosts, render_manual(spec), strict=True)):
        print(f"# on {host.name} (node {rank} of {len(spec.hosts)}):")
        print(line)
    return 0


_RUNNERS = {"hosts": _run_hosts, "mpirun": _run_mpirun, "slurm": _run_slurm, "manual": _run_manual}


# ---- helpers ---------------------------------------------------------------------------------


def _command(words: list[str]) -> tuple[str, ...]:
    if words and words[0] == "--":
        words = words[1:]
    if not words:
        raise ShoalError(
            "no command given", "put the command after --, e.g. `-- shoal train digits` or `-- train.py --lr 0.1`"
        )
    return tuple(words)


def _hosts(args: argparse.Namespace, *, required: bool):
    from shoal.launch.spec import parse_hosts, read_hostfile

    if args.nproc_per_node < 1:
        raise ShoalError(f"--nproc-per-node must be at least 1, got {args.nproc_per_node}", "give 1 or more")
    if args.hosts and args.hostfile:
        raise ShoalError("--hosts and --hostfile both given", "give one of them")
    if args.hostfile:
        return read_hostfile(args.hostfile)
    if args.hosts is not None:
        return parse_hosts(args.hosts, args.nproc_per_node)
    if required:
        raise ShoalError("no hosts given", "give --hosts node1:2,node2:2 (HOST:SLOTS,...) or --hostfile FILE")
    return ()


def _port(args: argparse.Namespace, hosts, here) -> int | None:
    """``--master-port``; else a free port when the rendezvous is served here (so jobs sharing this
    machine never collide), else None (29500)."""
    if args.master_port is not None:
        return args.master_port
    rendezvous_host = args.master_addr or (hosts[0].name if hosts else "127.0.0.1")
    if here.is_local(rendezvous_host):
        from shoal.launch.ports import find_free_port

        return find_free_port("0.0.0.0")
    return None


def _write_script(path: str, text: str, marker: str) -> None:
    """Write ``text`` to ``path``; an existing file is replaced only if shoal rendered it."""
    if os.path.exists(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            head = f.read(4096)
        if marker not in head:
            raise ShoalError(
                f"{path} exists and was not written by shoal launch slurm",
                "give another --script FILE (or --job-name), or move the file away",
            )
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "es" if noun.endswith("s") else "s")


def _host_list(spec) -> str:
    return ",".join(str(h) for h in spec.hosts) or "this machine"


def _announce(line: str) -> None:
    print(f"shoal launch: {line}", file=sys.stderr, flush=True)


def _shell(argv: Sequence[str]) -> str:
    import shlex

    return shlex.join(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m shoal.cli.launch ...``: this command alone, errors printed as ``shoal`` prints them."""
    try:
        return main_raw(sys.argv[1:] if argv is None else argv)
    except ShoalError as err:
        print(err.format(), file=sys.stderr, flush=True)
        return err.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
