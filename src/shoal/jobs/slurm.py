"""An sbatch script: one ``shoal run`` launcher per node, or ``srun`` starting every process."""

from __future__ import annotations

import shlex

from shoal.launch.as_torchrun import MODULE as AS_TORCHRUN_MODULE
from shoal.launch.spec import JobSpec

_SHELL_WORDS = frozenset({'"$SLURM_NNODES"', '"$head_node:$port"', '"$SLURM_JOB_ID"'})
"""Words of the sbatch launcher line the shell expands (left unquoted)."""
SBATCH_MARKER = "# Rendered by `shoal launch slurm`"
"""First comment line of every rendered sbatch script (shoal overwrites only files that have it)."""


def render_sbatch(spec: JobSpec) -> str:
    """An sbatch script for ``spec.nodes`` nodes with ``spec.nproc`` processes each.

    Default: ``srun --ntasks-per-node=1`` starts one ``shoal run`` launcher per node; they meet in a
    c10d rendezvous on the allocation's first node (``scontrol show hostnames``), which serves the
    store, and each starts its processes. Each launcher is given ``--cpus-per-task`` for all its
    processes (Slurm would otherwise allot it one core). ``one_task_per_process``: srun starts
    every process as a task of its own, through :mod:`shoal.launch.as_torchrun`, which exports
    torchrun's variables derived from Slurm's (so an unchanged torchrun-style script runs, and
    ``shoal.init()`` still reads Slurm's).
    """
    nproc, cpus = spec.nproc, spec.cpus_per_node
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
            "# each gets torchrun's variables (RANK, LOCAL_RANK, ..., MASTER_ADDR: the first node) from Slurm's.",
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
        lines.append(_continued(srun, [spec.python, "-m", AS_TORCHRUN_MODULE, "--"], spec.process_argv()))
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
