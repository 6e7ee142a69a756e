"""Pure renderers: one :class:`~shoal.launch.spec.JobSpec` in, a launcher's command or script out.

- :func:`render_mpirun`: Open MPI's ``mpirun`` starting every process (each runs the command and
  finds its rank in ``OMPI_COMM_WORLD_*``);
- :func:`render_sbatch`: an sbatch script, one ``shoal run`` launcher per node meeting in a c10d
  rendezvous on the allocation's first node, or ``srun`` starting every process;
- :func:`render_manual`: the ``shoal run`` line to type on each node for a by-hand launch;
- :func:`render_ssh`: those lines wrapped to be started over SSH from one node.

No function here reads the environment, the clock or the file system: what they depend on is in
their arguments, so ``--dry-run`` shows exactly what runs and golden files pin it
(``tests/launch/golden/``).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from shoal.env.network import bracket
from shoal.launch.spec import Here, Host, JobSpec

# Open MPI flags the multi-node tutorials use (Horovod's mpirun guide, for one): every rank sees all the
# node's cores (torch sets its own threads; Open MPI would pin each rank to one core), ranks fill
# one host's slots before the next, and the TCP byte-transfer layer without InfiniBand's verbs
# (openib), which torch does not use and which warns or fails on machines without it.
MPIRUN_FLAGS = ("-bind-to", "none", "-map-by", "slot", "-mca", "pml", "ob1", "-mca", "btl", "^openib")
_SHELL_WORDS = frozenset({'"$SLURM_NNODES"', '"$head_node:$port"', '"$SLURM_JOB_ID"'})
"""Words of the sbatch launcher line the shell expands (left unquoted)."""
SBATCH_MARKER = "# Rendered by `shoal launch slurm`"
"""First comment line of every rendered sbatch script (shoal overwrites only files that have it)."""


def render_mpirun(spec: JobSpec, here: Here) -> list[str]:
    """The ``mpirun`` argv that starts ``spec.world_size`` processes running ``spec.command``.

    ``-x MASTER_ADDR=... -x MASTER_PORT=...`` tell every rank where rank 0's rendezvous is (Open
    MPI exports no address); ``-x PATH`` and the other forwarded variables make remote ranks find
    the same programs. ``--allow-run-as-root`` when launching as root; ``--oversubscribe`` when
    there are more processes than slots, or more slots on this machine than it has cores.
    """
    np = spec.world_size
    argv = ["mpirun", "-np", str(np)]
    if spec.hostfile:
        argv += ["--hostfile", spec.hostfile]
    elif spec.hosts:
        argv += ["-H", ",".join(str(h) for h in spec.hosts)]
    if here.is_root:
        argv.append("--allow-run-as-root")
    slots = spec.total_slots if spec.hosts else here.cores
    if np > slots or any(here.is_local(h.name) and h.slots > here.cores for h in spec.hosts):
        argv.append("--oversubscribe")
    argv += MPIRUN_FLAGS
    if spec.rsh:
        argv += ["-mca", "plm_rsh_agent", spec.rsh]
    argv += ["-x", f"MASTER_ADDR={spec.main_address()}", "-x", f"MASTER_PORT={spec.port()}"]
    for name, value in spec.env:
        argv += ["-x", name if value is None else f"{name}={value}"]
    return argv + spec.process_argv()


def render_manual(spec: JobSpec) -> list[str]:
    """One ``shoal run`` command line per host, in node-rank order, for a by-hand launch.

    Static rendezvous: node ``i`` gets ``--node-rank i`` and the first host serves the store. c10d:
    every line is the same apart from ``--nproc``; nodes may start in any order.
    """
    return [_command_line(spec.env, _launcher_argv(spec, rank, host)) for rank, host in enumerate(_require_hosts(spec))]


def render_ssh(spec: JobSpec, here: Here, environ: Mapping[str, str]) -> list[list[str]]:
    """The argv that starts node ``i``'s launcher, one per host in node-rank order.

    A host that is this machine runs ``sh -c LINE`` here; any other runs ``ssh HOST LINE`` (or
    ``spec.rsh HOST LINE``). LINE changes to ``spec.workdir``, sets the variables of ``spec.env``
    (values of ``(name, None)`` entries come from ``environ``, the launching shell's) and runs
    ``shoal run`` under a guard: when the connection's stdin closes (``shoal launch`` stopped the
    job, died, or lost the connection) the launcher gets SIGTERM and stops its workers, so nothing
    is left running on a remote host. SSH without a terminal would not signal it at all.
    """
    env = [
        (name, environ[name] if value is None else value)
        for name, value in spec.env
        if value is not None or name in environ
    ]
    commands = []
    for rank, host in enumerate(_require_hosts(spec)):
        line = _guarded(spec.workdir, _command_line(env, _launcher_argv(spec, rank, host)))
        if here.is_local(host.name):
            commands.append(["sh", "-c", line])
        else:
            rsh = shlex.split(spec.rsh) if spec.rsh else ["ssh", "-o", "BatchMode=yes"]
            commands.append([*rsh, host.name, line])
    return commands


def render_sbatch(spec: JobSpec) -> str:
    """An sbatch script for ``spec.nodes`` nodes with ``spec.nproc_per_node`` processes each.

    Default: ``srun --ntasks-per-node=1`` starts one ``shoal run`` launcher per node; they meet in a
    c10d rendezvous on the allocation's first node (``scontrol show hostnames``), which serves the
    store, and each starts its processes. Each launcher is given ``--cpus-per-task`` for all its
    processes (Slurm would otherwise allot it one core). ``one_task_per_process``: srun starts
    every process as a task of its own; ``shoal.init()`` reads rank, world size and the first node
    from Slurm's variables.
    """
    nproc, cpus = spec.nproc_per_node, spec.cpus_per_node
    if spec.one_task_per_process:
        tasks_per_node, cpus_per_task = nproc, (max(1, cpus // nproc) if cpus else None)
    else:
        tasks_per_node, cpus_per_task = 1, cpus or nproc
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={spec.job_name}",
        f"#SBATCH --nodes={spec.nodes}",
        f"#SBATCH --ntasks-per-node={tasks_per_node}",
    ]
    if cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={cpus_per_task}")
    if spec.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={spec.gpus_per_node}")
    if spec.partition:
        lines.append(f"#SBATCH --partition={spec.partition}")
    if spec.time_limit:
        lines.append(f"#SBATCH --time={spec.time_limit}")
    lines.append(f"#SBATCH --output={spec.output}")
    if spec.error:
        lines.append(f"#SBATCH --error={spec.error}")
    if spec.workdir:
        lines.append(f"#SBATCH --chdir={spec.workdir}")
    world = spec.nodes * nproc
    if spec.one_task_per_process:
        lines += [
            f"{SBATCH_MARKER} --one-task-per-process: srun starts all {world} processes;",
            "# each finds its rank, the world size and the rendezvous (the first node) in Slurm's variables.",
        ]
    else:
        lines += [
            f"{SBATCH_MARKER}: one `shoal run` launcher per node starts {nproc} process{'es' if nproc != 1 else ''};",
            "# the launchers meet in a c10d rendezvous served by the first node of the allocation.",
        ]
    lines += ["set -eu", ""]
    env = [(name, value) for name, value in spec.env if value is not None]  # the rest: sbatch exports
    lines += [f"export {name}={shlex.quote(value)}" for name, value in env]
    if env:
        lines.append("")
    srun = ["srun"]
    if spec.one_task_per_process:
        if spec.master_port is not None:
            lines += [f"export MASTER_PORT={spec.master_port}", ""]
        if cpus_per_task:  # srun does not take it from sbatch since Slurm 22.05
            srun.append(f"--cpus-per-task={cpus_per_task}")
        srun.append("--kill-on-bad-exit=1")
        lines.append(_continued(srun, spec.process_argv()))
        return "\n".join(lines) + "\n"
    lines.append('head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)')
    if spec.master_port is None:
        lines.append(
            "port=$((15000 + SLURM_JOB_ID % 5000))  # as shoal derives it in srun steps: jobs sharing a node differ"
        )
    else:
        lines.append(f"port={spec.master_port}")
    lines += ['echo "shoal: job $SLURM_JOB_ID, $SLURM_NNODES nodes, rendezvous $head_node:$port"', ""]
    srun += ["--ntasks-per-node=1", f"--cpus-per-task={cpus_per_task}", "--kill-on-bad-exit=1"]
    launcher = [*spec.shoal, "run", "--nnodes", '"$SLURM_NNODES"', "--nproc", str(nproc)]
    if spec.max_restarts:
        launcher += ["--max-restarts", str(spec.max_restarts)]
    rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", '"$head_node:$port"', "--rdzv-id", '"$SLURM_JOB_ID"']
    lines.append(_continued(srun, launcher, rendezvous, spec.launcher_target()))
    return "\n".join(lines) + "\n"


# ---- helpers ----------------------------------------------------------------------------------


def _require_hosts(spec: JobSpec) -> tuple[Host, ...]:
    if not spec.hosts:
        from shoal.errors import ShoalError

        raise ShoalError("no hosts given", "give --hosts node1:2,node2:2 (or --hostfile FILE)")
    return spec.hosts


def _launcher_argv(spec: JobSpec, rank: int, host: Host) -> list[str]:
    """``shoal run`` for node ``rank`` of a host-list job."""
    argv = [*spec.shoal, "run", "--nnodes", str(len(spec.hosts))]
    if spec.rdzv == "static":
        argv += [
            "--node-rank",
            str(rank),
            "--nproc",
            str(host.slots),
            "--master-addr",
            spec.main_address(),
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
            f"{bracket(spec.main_address())}:{spec.port()}",
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


def _continued(*groups: list[str], width: int = 100) -> str:
    """One shell command: each group of words starts a line (``\\``-continued), long ones wrap.

    Words are quoted for the shell except those in :data:`_SHELL_WORDS`, which it must expand.
    """
    lines: list[str] = []
    for group in groups:
        if not group:
            continue
        words = [word if word in _SHELL_WORDS else shlex.quote(word) for word in group]
        current = ("    " if lines else "") + words[0]
        for word in words[1:]:
            if len(current) + 1 + len(word) > width - 2:
                lines.append(current)
                current = "    " + word
            else:
                current += " " + word
        lines.append(current)
    return " \\\n".join(lines)
