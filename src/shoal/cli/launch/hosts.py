"""``shoal launch [--hosts ...]``, ``shoal launch mpirun`` and ``shoal launch manual``: a list of hosts.

From the head node, through Open MPI's mpirun when it is installed (one process per slot, each run
through :mod:`shoal.launch.as_torchrun`, so a torchrun-style script sees torchrun's variables), else
through SSH (one ``shoal run`` per host); the mpirun command line alone; or the ``shoal run`` line
to type on each node. This module parses their flags and builds the job; the hosts target submits
it (:mod:`shoal.jobs.hosts.submit`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from shoal.cli.launch.common import (
    add_command,
    add_env,
    add_max_restarts,
    add_nproc,
    add_python,
    announce,
    env_items,
    parser,
    warn_local_paths,
)
from shoal.errors import ShoalError


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
    add_env(p)
    add_command(p)


def _add_hosts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hosts", metavar="H:N,...", help="hosts and their slots (processes), e.g. node1:2,node2:2")
    p.add_argument("--hostfile", metavar="FILE", help="Open MPI hostfile: one `HOST slots=N` per line")
    add_nproc(p, "slots (processes) of a host given without :N (default 1)", default=1)


def _add_python(p: argparse.ArgumentParser) -> None:
    add_python(
        p, "every host (default: the one running shoal, whose directory also goes first on the PATH every process gets)"
    )


def _add_launcher(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rdzv-backend",
        "--rdzv",
        dest="rdzv_backend",
        choices=("static", "c10d"),
        default="static",
        help="per-node launchers' rendezvous: static (node ranks in host order, default) or c10d",
    )
    add_max_restarts(p, "restart the whole group up to K times after a worker fails")


def hosts_parser() -> argparse.ArgumentParser:
    p = parser(
        "shoal launch",
        "Start COMMAND on every slot of the given hosts from this node: through "
        "Open MPI's mpirun when it is installed (one process per slot, each given torchrun's "
        "variables from mpirun's), else through SSH (one `shoal run` launcher per host). Other forms: "
        "`shoal launch mpirun|slurm|manual|k8s|runai|image --help`.",
    )
    _add_hosts(p)
    p.add_argument(
        "--via",
        choices=("auto", "mpirun", "ssh"),
        default="auto",
        help="auto (default): mpirun if it is on PATH, else ssh",
    )
    p.add_argument("--rsh", metavar="PROGRAM", help="how to reach another host (default ssh; mpirun's plm_rsh_agent)")
    _add_python(p)
    _add_launcher(p)
    _add_common(p)
    return p


def mpirun_parser() -> argparse.ArgumentParser:
    p = parser(
        "shoal launch mpirun",
        "Run COMMAND as N processes with Open MPI's mpirun, with the flags "
        "a multi-node PyTorch job needs (rendezvous address exported, no core binding, TCP).",
    )
    p.add_argument(
        "-np", "-n", "--np", dest="np", type=int, metavar="N", help="processes (default: the hosts' slots added up)"
    )
    _add_hosts(p)
    p.add_argument("--rsh", metavar="PROGRAM", help="how mpirun reaches another host (plm_rsh_agent)")
    _add_python(p)
    _add_common(p)
    return p


def manual_parser() -> argparse.ArgumentParser:
    p = parser(
        "shoal launch manual",
        "Print the `shoal run` command line to type on each host, in "
        "node-rank order (the first host serves the rendezvous).",
    )
    _add_hosts(p)
    _add_launcher(p)
    _add_common(p)
    return p


# ---- runners ---------------------------------------------------------------------------------


def run_hosts(args: argparse.Namespace) -> int:
    from shoal.jobs.hosts.options import Here
    from shoal.jobs.hosts.submit import submit_mpirun, submit_ssh
    from shoal.jobs.spec import JobSpec

    hosts = _hosts(args, required=True)
    via = args.via
    if via == "auto":
        via = "mpirun" if shutil.which("mpirun") else "ssh"
    here = Here.detect(hosts)
    _warn_local_paths(args, _options(hosts, args), here)
    python = args.python or sys.executable
    common = dict(
        command=args.command,
        master_addr=args.master_addr,
        master_port=_port(args, hosts, here),
        env=_env(args, python),
        python=python,
    )
    if via == "mpirun":
        if args.rdzv_backend != "static" or args.max_restarts:
            raise ShoalError(
                "--rdzv-backend and --max-restarts apply to per-node launchers, not to mpirun",
                "add --via ssh, or drop them (mpirun starts the processes itself)",
            )
        spec = JobSpec(**common)
        opts = _options(hosts, args, hostfile=args.hostfile)
        return submit_mpirun(spec, opts, here, announce=announce, dry_run=args.dry_run, on_hosts=True)
    spec = JobSpec(
        **common,
        rdzv_backend=args.rdzv_backend,
        max_restarts=args.max_restarts,
        workdir=os.getcwd(),
        shoal=(python, "-m", "shoal"),
    )
    return submit_ssh(spec, _options(hosts, args), here, announce=announce, dry_run=args.dry_run)


def run_mpirun(args: argparse.Namespace) -> int:
    from shoal.jobs.hosts.options import Here
    from shoal.jobs.hosts.submit import submit_mpirun
    from shoal.jobs.spec import JobSpec

    hosts = _hosts(args, required=False)
    if args.np is None and not hosts:
        raise ShoalError("no process count", "give -np N (and --hosts for several machines)")
    here = Here.detect(hosts)
    if not hosts and not args.master_addr:
        # Inside a Slurm allocation mpirun spreads the ranks over its nodes; rank 0 runs on the first.
        from shoal.env.slurm import allocation_first_node

        args.master_addr = allocation_first_node(os.environ) or args.master_addr
    _warn_local_paths(args, _options(hosts, args), here)
    python = args.python or sys.executable
    spec = JobSpec(
        command=args.command,
        master_addr=args.master_addr,
        master_port=_port(args, hosts, here),
        env=_env(args, python),
        python=python,
    )
    opts = _options(hosts, args, hostfile=args.hostfile, np=args.np)
    return submit_mpirun(spec, opts, here, announce=announce, dry_run=args.dry_run)


def run_manual(args: argparse.Namespace) -> int:
    from shoal.jobs.hosts.options import Here, HostsOptions
    from shoal.jobs.hosts.render import render_manual
    from shoal.jobs.spec import JobSpec, parse_env

    spec = JobSpec(
        command=args.command,
        master_addr=args.master_addr,
        master_port=args.master_port,
        rdzv_backend=args.rdzv_backend,
        max_restarts=args.max_restarts,
        env=parse_env(env_items(args)),
    )
    opts = HostsOptions(hosts=_hosts(args, required=True))
    _warn_local_paths(args, opts, Here.detect(opts.hosts))
    for rank, (host, line) in enumerate(zip(opts.hosts, render_manual(spec, opts), strict=True)):
        print(f"# on {host.name} (node {rank} of {len(opts.hosts)}):")
        print(line)
    return 0


# ---- helpers ---------------------------------------------------------------------------------


def _env(args: argparse.Namespace, python: str):
    """The variables every process gets: the forwarded ones, ``--env``, and PATH led by ``python``'s dir."""
    from shoal.jobs.hosts.options import forwarded_env, interpreter_first
    from shoal.jobs.spec import parse_env

    return interpreter_first(forwarded_env(os.environ, parse_env(env_items(args))), os.environ, python)


def _warn_local_paths(args: argparse.Namespace, opts, here) -> None:
    """``--env`` values holding the Horovod shim's path here, when a host is another machine."""
    from shoal.jobs.hosts.submit import remote_hosts
    from shoal.jobs.spec import parse_env

    if remote_hosts(opts, here):
        env = parse_env(args.env)
        warn_local_paths(env, os.environ, where="the other hosts", shared_files=True)
        # PYTHONPATH is passed on from this shell unasked (FORWARDED_ENV): the shim's path of this machine too.
        unasked = [("PYTHONPATH", None)] if "PYTHONPATH" not in dict(env) else []
        label = "{name} (passed on from this shell)"
        warn_local_paths(unasked, os.environ, where="the other hosts", shared_files=True, label=label)


def _hosts(args: argparse.Namespace, *, required: bool):
    from shoal.jobs.hosts.options import parse_hosts, read_hostfile
    from shoal.shape import check_nproc

    check_nproc(args.nproc, "--nproc-per-node")
    if args.hosts and args.hostfile:
        raise ShoalError("--hosts and --hostfile both given", "give one of them")
    if args.hostfile:
        return read_hostfile(args.hostfile)
    if args.hosts is not None:
        return parse_hosts(args.hosts, args.nproc)
    if required:
        raise ShoalError("no hosts given", "give --hosts node1:2,node2:2 (HOST:SLOTS,...) or --hostfile FILE")
    return ()


def _options(hosts, args: argparse.Namespace, **extra):
    from shoal.jobs.hosts.options import HostsOptions

    return HostsOptions(hosts=hosts, rsh=args.rsh, **extra)


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
