"""Renderers for a list of hosts: ``mpirun`` starting every process, or one ``shoal run`` per host.

Each takes the generic :class:`~shoal.jobs.spec.JobSpec` and this target's
:class:`~shoal.jobs.hosts.options.HostsOptions`, and is pure: what it depends on is in its
arguments, so ``--dry-run`` shows exactly what runs and golden files pin it.

- :func:`render_mpirun`: Open MPI's ``mpirun`` starting every process (each runs the command
  through a shim that exports torchrun's variables, derived from ``OMPI_COMM_WORLD_*``);
- :func:`render_manual`: the ``shoal run`` line to type on each node for a by-hand launch;
- :func:`render_ssh`: those lines wrapped to be started over SSH from one node.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from shoal.env.network import bracket
from shoal.errors import ShoalError
from shoal.jobs.hosts.options import Here, Host, HostsOptions
from shoal.jobs.spec import JobSpec, looks_secret
from shoal.launch.as_torchrun import MODULE as AS_TORCHRUN_MODULE

# Open MPI flags the multi-node tutorials use (Horovod's mpirun guide, for one): every rank sees all the
# node's cores (torch sets its own threads; Open MPI would pin each rank to one core), ranks fill
# one host's slots before the next, and the TCP byte-transfer layer without InfiniBand's verbs
# (openib), which torch does not use and which warns or fails on machines without it.
MPIRUN_FLAGS = ("-bind-to", "none", "-map-by", "slot", "-mca", "pml", "ob1", "-mca", "btl", "^openib")


RANK_STATUS_MODULE = "shoal.jobs.hosts.rank_status"
"""The wrapper that reports each rank's exit status to ``shoal launch`` (see :func:`render_mpirun`)."""


def render_mpirun(
    spec: JobSpec, opts: HostsOptions, here: Here, *, hosts_from_env: bool = False, report_status: bool = False
) -> list[str]:
    """The ``mpirun`` argv that starts ``opts.world_size()`` processes running ``spec.command``.

    ``-x MASTER_ADDR=... -x MASTER_PORT=...`` tell every rank where rank 0's rendezvous is (Open
    MPI exports no address); ``-x PATH`` and the other forwarded variables make remote ranks find
    the same programs. Every rank runs the command through :mod:`shoal.launch.as_torchrun`, which
    exports torchrun's variables (RANK, LOCAL_RANK, GROUP_RANK, ...) derived from Open MPI's and
    execs it, so an unchanged torchrun-style script works (``--ranks-per-node`` when the hosts'
    rank counts differ, as the shim cannot tell a node's index from Open MPI's variables then). ``--allow-run-as-root`` when launching as root; ``--oversubscribe`` when
    there are more processes than slots, or more slots on this machine than it has cores.

    ``hosts_from_env``: ``opts.hosts`` are only counted, not written: mpirun reads them from the
    hostfile named by ``OMPI_MCA_orte_default_hostfile`` (the MPI operator sets it on the launcher).
    ``report_status``: every rank runs under :mod:`shoal.jobs.hosts.rank_status` instead, which
    exports the same variables, then prints the command's exit status for ``shoal launch`` to collect, and mpirun lets the others run on after a rank fails
    (``orte_abort_on_non_zero_status 0``), so that ``shoal launch`` can tell the rank with the cause
    from ranks stopped because of it, then stop the job itself.
    """
    np = opts.world_size()
    if np < 1:
        raise ShoalError("no process count", "give -np N (and --hosts for several machines)")
    argv = ["mpirun", "-np", str(np)]
    if opts.hostfile and not hosts_from_env:
        argv += ["--hostfile", opts.hostfile]
    elif opts.hosts and not hosts_from_env:
        argv += ["-H", ",".join(str(h) for h in opts.hosts)]
    if here.is_root:
        argv.append("--allow-run-as-root")
    slots = opts.total_slots if opts.hosts else here.cores
    if np > slots or any(here.is_local(h.name) and h.slots > here.cores for h in opts.hosts):
        argv.append("--oversubscribe")
    argv += MPIRUN_FLAGS
    if opts.rsh:
        argv += ["-mca", "plm_rsh_agent", opts.rsh]
    if report_status:
        argv += ["-mca", "orte_abort_on_non_zero_status", "0"]
    argv += ["-x", f"MASTER_ADDR={opts.main_address(spec)}", "-x", f"MASTER_PORT={spec.port()}"]
    for name, value in spec.env:
        argv += ["-x", name if value is None else f"{name}={value}"]
    wrapper = [spec.python, "-m", RANK_STATUS_MODULE if report_status else AS_TORCHRUN_MODULE]
    ranks = ranks_per_node(opts) if not hosts_from_env else []
    if len(set(ranks)) > 1:
        wrapper += ["--ranks-per-node", ",".join(map(str, ranks))]
    return [*argv, *wrapper, "--", *spec.process_argv()]


def ranks_per_node(opts: HostsOptions) -> list[int]:
    """Ranks on each host under ``-map-by slot`` (each host's slots in turn), hosts without any left out."""
    counts, left = [], opts.world_size()
    for host in opts.hosts:
        counts.append(min(host.slots, left))
        left -= counts[-1]
    return [n for n in counts if n]


def render_manual(spec: JobSpec, opts: HostsOptions) -> list[str]:
    """One ``shoal run`` command line per host, in node-rank order, for a by-hand launch.

    Static rendezvous: node ``i`` gets ``--node-rank i`` and the first host serves the store. c10d:
    every line is the same apart from ``--nproc``; nodes may start in any order.
    """
    return [
        _command_line(spec.env, _launcher_argv(spec, opts, rank, host))
        for rank, host in enumerate(_require_hosts(opts))
    ]


def render_ssh(spec: JobSpec, opts: HostsOptions, here: Here, environ: Mapping[str, str]) -> list[list[str]]:
    """The argv that starts node ``i``'s launcher, one per host in node-rank order.

    A host that is this machine runs ``sh -c LINE`` here; any other runs ``ssh HOST LINE`` (or
    ``opts.rsh HOST LINE``). LINE changes to ``spec.workdir``, sets the variables of ``spec.env``
    (values of ``(name, None)`` entries come from ``environ``, the launching shell's) and runs
    ``shoal run`` under a guard: when the connection's stdin closes (``shoal launch`` stopped the
    job, died, or lost the connection) the launcher gets SIGTERM and stops its workers, so nothing
    is left running on a remote host. SSH without a terminal would not signal it at all.
    """
    secrets = [name for name, value in spec.env if value is None and looks_secret(name)]
    if secrets:
        raise ShoalError(
            f"--env {secrets[0]} looks like a secret: over SSH its value would be written into the remote "
            "command line (visible in ps and in --dry-run)",
            f"set {secrets[0]} in the remote hosts' environment (a file the job sources), or use --via mpirun, "
            "which passes it by name",
        )
    env = [
        (name, environ[name] if value is None else value)
        for name, value in spec.env
        if value is not None or name in environ
    ]
    commands = []
    for rank, host in enumerate(_require_hosts(opts)):
        line = _guarded(spec.workdir, _command_line(env, _launcher_argv(spec, opts, rank, host)))
        if here.is_local(host.name):
            commands.append(["sh", "-c", line])
        else:
            rsh = shlex.split(opts.rsh) if opts.rsh else ["ssh", "-o", "BatchMode=yes"]
            commands.append([*rsh, host.name, line])
    return commands


# ---- helpers ----------------------------------------------------------------------------------


def _require_hosts(opts: HostsOptions) -> tuple[Host, ...]:
    if not opts.hosts:
        raise ShoalError("no hosts given", "give --hosts node1:2,node2:2 (or --hostfile FILE)")
    return opts.hosts


def _launcher_argv(spec: JobSpec, opts: HostsOptions, rank: int, host: Host) -> list[str]:
    """``shoal run`` for node ``rank`` of a host-list job."""
    argv = [*spec.shoal, "run", "--nnodes", str(len(opts.hosts))]
    if spec.rdzv_backend == "static":
        argv += [
            "--node-rank",
            str(rank),
            "--nproc",
            str(host.slots),
            "--master-addr",
            opts.main_address(spec),
            "--master-port",
            str(spec.port()),
        ]
    else:
        argv += [
            "--nproc",
            str(host.slots),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"{bracket(opts.main_address(spec))}:{spec.port()}",
            "--rdzv-id",
            spec.job_name,
        ]
    if spec.max_restarts:
        argv += ["--max-restarts", str(spec.max_restarts)]
    return argv + spec.launcher_target()


def _command_line(env, argv: list[str]) -> str:
    """``NAME=VALUE ... ARGV`` as one shell line (values quoted, names are checked identifiers)."""
    assignments = [f"{name}={shlex.quote(value)}" for name, value in env if value is not None]
    return " ".join([*assignments, shlex.join(argv)])


def _guarded(workdir: str | None, command: str) -> str:
    """A shell line running ``command`` that SIGTERMs it when stdin closes (see :func:`render_ssh`).

    stdin is kept on fd 3 for a watcher (``cat``) and the command reads /dev/null; the watcher
    holds none of the connection's output, so the session ends as soon as the command does, and it
    is stopped then, so it cannot signal a later process that reuses the PID.
    """
    cd = f"cd {shlex.quote(workdir)} || exit 1; " if workdir else ""
    return (
        f"{cd}exec 3<&0 </dev/null; {command} 3<&- & pid=$!; "
        "{ cat <&3; kill -TERM $pid; } >/dev/null 2>&1 & watcher=$!; exec 3<&-; "
        "wait $pid; status=$?; kill $watcher 2>/dev/null; exit $status"
    )
