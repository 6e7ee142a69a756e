"""The Slurm target: its options, the sbatch script (one ``shoal run`` launcher per node, or ``srun``
starting every process), and submitting it with sbatch. A fault-tolerant command's script (a job
step per replica group) is :mod:`shoal.jobs.slurm_fault_tolerance`'s, from the pieces here.

:class:`SlurmOptions` holds what only Slurm needs (partition, time limit, output files, cores per
node, srun starting every process); :func:`render_sbatch` is pure (golden files pin it);
:func:`submit_sbatch` hands the written script to ``sbatch``.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass

from shoal.errors import ShoalError
from shoal.jobs.programs import require_program
from shoal.jobs.spec import JobSpec
from shoal.launch.as_torchrun import MODULE as AS_TORCHRUN_MODULE

_SHELL_WORDS = frozenset({'"$SLURM_NNODES"', '"$head_node:$port"', '"$SLURM_JOB_ID"'})
"""Words of the sbatch launcher line the shell expands (left unquoted)."""
SBATCH_MARKER = "# Rendered by `shoal launch slurm`"
"""First comment line of every rendered sbatch script (shoal overwrites only files that have it)."""
SBATCH_HINT = "run it on a Slurm login node, or add --dry-run to print the script"
_TIME = re.compile(r"(\d+-)?\d+(:\d+){0,2}|infinite|unlimited", re.I)
WARNING_SIGNAL = "USR1"
WARNING_S = 60
"""``#SBATCH --signal=USR1@60``: Slurm sends SIGUSR1 to the job's steps this long before the time
limit; every rank then checkpoints and exits within the preemption grace
(:data:`shoal.env.grace.PREEMPT_GRACE_S`, plus its exit margin), well inside the 60 s."""
LAUNCHER_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
"""``shoal run --signals-to-handle``: torch's agent forwards these to the workers (its default lacks
SIGUSR1, which would end the launcher and leave the workers to ``--kill-on-bad-exit``)."""


@dataclass(frozen=True, kw_only=True)
class SlurmOptions:
    """What a job needs on Slurm beyond what it runs: where, for how long, its files, its cores."""

    partition: str | None = None
    time_limit: str | None = None
    """Slurm time limit (``MM``, ``HH:MM:SS``, ``D-HH:MM``, ...)."""
    output: str = "shoal-%j.out"
    """sbatch's output file (``%j``: the job id); stderr goes there too unless ``error`` is set."""
    error: str | None = None
    cpus_per_node: int | None = None
    """CPU cores to allocate on every node; default one per process."""
    one_task_per_process: bool = False
    """srun starts every process itself (shoal detects Slurm) instead of one launcher per node."""
    spare_nodes: int = 0
    """A fault-tolerant job's nodes beyond its replica groups': idle until a node is lost, when the
    lost node's groups start again there (:mod:`shoal.jobs.slurm_fault_tolerance`)."""

    def __post_init__(self) -> None:
        if self.cpus_per_node is not None and self.cpus_per_node < 1:
            raise ShoalError(
                f"CPUs per node must be at least 1, got {self.cpus_per_node}", "give --cpus-per-node 1 or more"
            )
        if self.spare_nodes < 0:
            raise ShoalError(f"--spare-nodes must be 0 or more, got {self.spare_nodes}", "give --spare-nodes 0 or more")
        if self.time_limit is not None and not _TIME.fullmatch(self.time_limit):
            raise ShoalError(
                f"--time {self.time_limit!r} is not a Slurm time limit",
                "use MINUTES, HH:MM:SS or D-HH:MM:SS, e.g. --time 1:30:00",
            )


def render_sbatch(spec: JobSpec, opts: SlurmOptions) -> str:
    """An sbatch script for ``spec.nodes`` nodes with ``spec.local_world_size`` processes each.

    ``#SBATCH --signal=USR1@60``: ahead of the time limit every rank gets SIGUSR1 (the launchers
    forward it), checkpoints and exits (:mod:`shoal.preemption`); the same command resumes. The
    interpreter and shoal are ``spec.python`` and ``spec.shoal`` (``shoal launch slurm``: the Python
    that rendered the script), never whatever ``python`` the job's PATH holds.

    Default: ``srun --ntasks-per-node=1`` starts one ``shoal run`` launcher per node; they meet in a
    c10d rendezvous on the allocation's first node (``scontrol show hostnames``), which serves the
    store, and each starts its processes. Each launcher is given ``--cpus-per-task`` for all its
    processes (Slurm would otherwise allot it one core). ``opts.one_task_per_process``: srun starts
    every process as a task of its own, through :mod:`shoal.launch.as_torchrun`, which exports
    torchrun's variables derived from Slurm's (so an unchanged torchrun-style script runs, and
    ``shoal.init()`` still reads Slurm's).
    """
    nproc, cpus = spec.local_world_size, opts.cpus_per_node
    if opts.one_task_per_process:
        tasks_per_node, cpus_per_task = nproc, (max(1, cpus // nproc) if cpus else None)
    else:
        tasks_per_node, cpus_per_task = 1, cpus or nproc
    lines = sbatch_head(
        spec, opts, nodes=spec.nodes, tasks_per_node=tasks_per_node, cpus_per_task=cpus_per_task,
        behaviour=[f"--signal={WARNING_SIGNAL}@{WARNING_S}"],
    )  # fmt: skip
    world = spec.nodes * nproc
    if opts.one_task_per_process:
        lines += [
            f"{SBATCH_MARKER} --one-task-per-process: srun starts all {world} processes;",
            "# each gets torchrun's variables (RANK, LOCAL_RANK, ..., MASTER_ADDR: the first node) from Slurm's.",
        ]
    else:
        lines += [
            f"{SBATCH_MARKER}: one `shoal run` launcher per node starts {nproc} process{'es' if nproc != 1 else ''};",
            "# the launchers meet in a c10d rendezvous served by the first node of the allocation.",
        ]
    lines += notes(nproc, cpus_per_task, per_task=opts.one_task_per_process, default=cpus is None)
    lines += ["set -eu", "", *exports(spec)]
    srun = ["srun"]
    if opts.one_task_per_process:
        if spec.master_port is not None:
            lines += [f"export MASTER_PORT={spec.master_port}", ""]
        if cpus_per_task:  # srun does not take it from sbatch since Slurm 22.05
            srun.append(f"--cpus-per-task={cpus_per_task}")
        srun.append("--kill-on-bad-exit=1")
        lines.append(continued(srun, [spec.python, "-m", AS_TORCHRUN_MODULE, "--"], spec.process_argv()))
        return "\n".join(lines) + "\n"
    lines.append('head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)')
    lines.append(port_line(spec))
    lines += ['echo "shoal: job $SLURM_JOB_ID, $SLURM_NNODES nodes, rendezvous $head_node:$port"', ""]
    srun += ["--ntasks-per-node=1", f"--cpus-per-task={cpus_per_task}", "--kill-on-bad-exit=1"]
    launcher = [*spec.shoal, "run", "--nnodes", '"$SLURM_NNODES"', "--nproc", str(nproc)]
    if spec.max_restarts:
        launcher += ["--max-restarts", str(spec.max_restarts)]
    rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", '"$head_node:$port"', "--rdzv-id", '"$SLURM_JOB_ID"']
    signals = ["--signals-to-handle", LAUNCHER_SIGNALS]
    lines.append(continued(srun, launcher, signals, rendezvous, spec.launcher_target()))
    return "\n".join(lines) + "\n"


def notes(nproc: int, cpus_per_task: int | None, *, per_task: bool, default: bool) -> list[str]:
    """What the script's ``--signal`` and ``--cpus-per-task`` do to a job, and how to change them,
    as comments: the pre-timeout SIGUSR1 stops a script that does not save on it, and one core per
    process leaves none for data loading."""
    lines = [
        f"# --signal={WARNING_SIGNAL}@{WARNING_S}: Slurm's warning {WARNING_S} s before --time ends. shoal train (and a "
        "script using",
        "#   ctx.preemption() with a checkpointer) saves and stops, and the same job submitted again resumes;",
        "#   any other script stops then (exit 138): delete the line to run up to the limit.",
    ]
    processes = f"{nproc} process{'es' if nproc != 1 else ''}"
    if cpus_per_task is None:
        return [
            *lines,
            "# No --cpus-per-task: Slurm gives each process one core; for data-loading workers give",
            "#   shoal launch slurm --cpus-per-node C (C cores per node, shared by its processes).",
        ]
    if default:
        first = f"# --cpus-per-task={cpus_per_task}: one core for each of this node's {processes}; for data-loading workers give"
    else:
        whose = "each process" if per_task else f"this node's {processes}"
        first = f"# --cpus-per-task={cpus_per_task}: the cores of {whose}, from --cpus-per-node; to change it give"
    return [
        *lines,
        first,
        "#   shoal launch slurm --cpus-per-node C (C cores per node), or edit both --cpus-per-task here.",
    ]


def sbatch_head(
    spec: JobSpec,
    opts: SlurmOptions,
    *,
    nodes: int,
    tasks_per_node: int,
    cpus_per_task: int | None,
    behaviour: list[str],
) -> list[str]:
    """The ``#SBATCH`` lines every rendered script starts with: the allocation, its name, its files,
    and ``behaviour`` (sbatch options such as ``--signal=USR1@60``) after the output file."""
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={spec.job_name}",
        f"#SBATCH --nodes={nodes}",
        f"#SBATCH --ntasks-per-node={tasks_per_node}",
    ]
    if cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={cpus_per_task}")
    if spec.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={spec.gpus_per_node}")
    if opts.partition:
        lines.append(f"#SBATCH --partition={opts.partition}")
    if opts.time_limit:
        lines.append(f"#SBATCH --time={opts.time_limit}")
    lines.append(f"#SBATCH --output={opts.output}")
    lines += [f"#SBATCH {option}" for option in behaviour]
    if opts.error:
        lines.append(f"#SBATCH --error={opts.error}")
    if spec.workdir:
        lines.append(f"#SBATCH --chdir={spec.workdir}")
    return lines


def exports(spec: JobSpec) -> list[str]:
    """``export NAME=VALUE`` for the variables given a value, then a blank line; sbatch exports
    the submitting shell's own (``--env NAME``) by itself."""
    env = [f"export {name}={shlex.quote(value)}" for name, value in spec.env if value is not None]
    return [*env, ""] if env else []


def port_line(spec: JobSpec) -> str:
    """``port=...``: ``--master-port``, else the port shoal derives in srun steps from the job id."""
    if spec.master_port is not None:
        return f"port={spec.master_port}"
    return "port=$((15000 + SLURM_JOB_ID % 5000))  # as shoal derives it in srun steps: jobs sharing a node differ"


def continued(*groups: list[str], width: int = 100, shell_words: frozenset[str] = _SHELL_WORDS) -> str:
    """One shell command: each group of words starts a line (``\\``-continued), long ones wrap.

    Words are quoted for the shell except those in ``shell_words``, which it must expand.
    """
    lines: list[str] = []
    for group in groups:
        if not group:
            continue
        words = [word if word in shell_words else shlex.quote(word) for word in group]
        current = ("    " if lines else "") + words[0]
        for word in words[1:]:
            if len(current) + 1 + len(word) > width - 2:
                lines.append(current)
                current = "    " + word
            else:
                current += " " + word
        lines.append(current)
    return " \\\n".join(lines)


def submit_sbatch(script_path: str) -> str:
    """``sbatch --parsable SCRIPT``; return the job id. ShoalError if sbatch is missing or refuses."""
    sbatch = require_program("sbatch", SBATCH_HINT)
    proc = subprocess.run([sbatch, "--parsable", script_path], capture_output=True, text=True)
    if proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise ShoalError(
            f"sbatch refused {script_path}: {reason}",
            "check the partition, time limit and node/GPU counts against `sinfo`",
            exit_code=1,
        )
    return proc.stdout.strip().split(";")[0]
