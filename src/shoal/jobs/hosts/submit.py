"""A host list's job handed over from the head node, as :mod:`shoal.jobs.slurm` submits a batch script.

Each submit renders the job (:mod:`~shoal.jobs.hosts.render`) and prints it instead for a dry run;
otherwise it finds the programs (:mod:`shoal.jobs.programs`), checks that every other host takes a
password-less login (:mod:`~shoal.jobs.hosts.reach`), says what starts, and runs mpirun or one
``shoal run`` launcher per host until the job ends, stopping the rest when one fails
(:mod:`~shoal.jobs.hosts.processes`). ``shoal launch``'s forms (:mod:`shoal.cli.launch.hosts`)
parse the flags, build the :class:`~shoal.jobs.spec.JobSpec` and
:class:`~shoal.jobs.hosts.options.HostsOptions`, and call one of these.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Mapping

from shoal.jobs.hosts import processes
from shoal.jobs.hosts.options import Here, HostsOptions
from shoal.jobs.hosts.reach import check_reachable
from shoal.jobs.hosts.render import ranks_per_node, render_mpirun, render_ssh
from shoal.jobs.programs import require_program
from shoal.jobs.spec import JobSpec

Announce = Callable[[str], None]
"""Says, in one line, what is about to start (``shoal launch: ...`` on stderr)."""


def submit_mpirun(
    spec: JobSpec, opts: HostsOptions, here: Here, *, announce: Announce, dry_run: bool = False, on_hosts: bool = False
) -> int:
    """Run ``spec`` with Open MPI's mpirun over ``opts``' hosts (or those mpirun finds itself: a
    Slurm allocation, this machine); return its exit status. ``on_hosts``: ``shoal launch --hosts``
    (each rank's exit status reported, a failed rank named by its host), not ``shoal launch mpirun``."""
    argv = render_mpirun(spec, opts, here, report_status=on_hosts)
    if dry_run:
        print(shlex.join(argv))
        return 0
    require_program("mpirun", processes.MPIRUN_HINT)
    check_reachable(remote_hosts(opts, here), opts.rsh, mpirun=True)
    where = f" on {_host_list(opts)}" if on_hosts else ""
    announce(
        f"mpirun, {count(opts.world_size(), 'process')}{where}, rendezvous {opts.main_address(spec)}:{spec.port()}"
    )
    return processes.supervise_mpirun(argv, ranks=_rank_hosts(opts) if on_hosts else None)


def submit_ssh(
    spec: JobSpec,
    opts: HostsOptions,
    here: Here,
    *,
    announce: Announce,
    dry_run: bool = False,
    environ: Mapping[str, str] | None = None,
) -> int:
    """Run one ``shoal run`` launcher per host of ``opts`` (this machine's directly, the others' over
    ``opts.rsh``, default ssh); return the job's exit status. ``environ``: this shell's (default
    ``os.environ``), whose forwarded variables every launcher gets."""
    commands = render_ssh(spec, opts, here, os.environ if environ is None else environ)
    if dry_run:
        for host, cmd in zip(opts.hosts, commands, strict=True):
            print(f"# {host}")
            print(shlex.join(cmd))
        return 0
    for program in dict.fromkeys(cmd[0] for cmd in commands):
        require_program(program, processes.SSH_HINT)
    check_reachable(remote_hosts(opts, here), opts.rsh)
    local = sum(here.is_local(h.name) for h in opts.hosts)
    parts = [f"{local} here"] if local else []
    if len(commands) > local:
        parts.append(f"{len(commands) - local} over {opts.rsh or 'ssh'}")
    announce(
        f"{count(len(commands), 'launcher')} ({', '.join(parts)}), {count(opts.world_size(), 'process')} on "
        f"{_host_list(opts)}, {spec.rdzv_backend} rendezvous {opts.main_address(spec)}:{spec.port()}"
    )
    return processes.run_launchers(commands, [f"host {h.name} (node {i})" for i, h in enumerate(opts.hosts)])


def remote_hosts(opts: HostsOptions, here: Here) -> list[str]:
    """The hosts of ``opts`` that are other machines than this one."""
    return [h.name for h in opts.hosts if not here.is_local(h.name)]


def count(n: int, noun: str) -> str:
    """``2 processes``, ``1 launcher``."""
    return f"{n} {noun}" + ("" if n == 1 else "es" if noun.endswith("s") else "s")


def _rank_hosts(opts: HostsOptions) -> list[str]:
    """The host of each rank under mpirun's ``-map-by slot``: each host's slots in turn."""
    return [h.name for h, ranks in zip(opts.hosts, ranks_per_node(opts)) for _ in range(ranks)]


def _host_list(opts: HostsOptions) -> str:
    return ",".join(str(h) for h in opts.hosts) or "this machine"
