"""``shoal launch slurm``: an sbatch script, written and submitted with sbatch."""

from __future__ import annotations

import argparse
import os
import sys

from shoal.cli.launch.common import (
    add_command,
    add_env,
    add_max_restarts,
    add_nodes,
    add_nproc,
    add_python,
    announce,
    env_items,
    parser,
    warn_local_paths,
    warn_missing_script,
    write_rendered,
)
from shoal.errors import ShoalError


def slurm_parser() -> argparse.ArgumentParser:
    p = parser(
        "shoal launch slurm",
        "Render an sbatch script (one `shoal run` launcher per node, c10d "
        "rendezvous on the allocation's first node; or srun starting every process with "
        "--one-task-per-process; for `shoal train --fault-tolerance`, a job step per replica group, started "
        "again when it fails, beside a lighthouse on the batch host), write it and submit it with sbatch; "
        "print the job id.",
    )
    add_nodes(p, "nodes to allocate (default 1)")
    p.add_argument("--gpus-per-node", type=int, default=0, metavar="G", help="GPUs per node (default 0)")
    add_nproc(p, "processes per node (default: --gpus-per-node, or 1)")
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
    add_max_restarts(
        p,
        "launchers restart the group up to K times after a worker fails (default 0); for a `shoal train "
        "--fault-tolerance` command, each replica group's job step is started again up to K times (default 10)",
    )
    p.add_argument(
        "--spare-nodes",
        type=int,
        default=0,
        metavar="K",
        help="`shoal train --fault-tolerance`: K nodes more than the replica groups fill, where a lost node's "
        "groups start again at once (default 0)",
    )
    p.add_argument("--script", metavar="FILE", help="where to write the script (default JOB_NAME.sbatch)")
    p.add_argument(
        "--master-port",
        type=int,
        metavar="PORT",
        help="rendezvous port, or a fault-tolerant job's lighthouse port (default 15000 + job id %% 5000)",
    )
    add_python(
        p,
        "every node (default: the one running shoal now, by its full path: the job does not depend on the "
        "PATH it is submitted with)",
    )
    add_env(p)
    add_command(p)
    p.set_defaults(max_restarts=None)  # unset: 0, or for a fault-tolerant command its groups' default
    return p


def run_slurm(args: argparse.Namespace) -> int:
    from shoal.jobs.programs import require_program
    from shoal.jobs.slurm import SBATCH_HINT, SBATCH_MARKER, SlurmOptions, render_sbatch, submit_sbatch
    from shoal.jobs.slurm_fault_tolerance import MAX_RESTARTS, render_replica_sbatch
    from shoal.jobs.spec import JobSpec, fault_tolerant, parse_env

    replicas = fault_tolerant(args.command)
    if args.max_restarts is None:
        args.max_restarts = MAX_RESTARTS if replicas else 0
    if args.spare_nodes and not replicas:
        raise ShoalError(
            "--spare-nodes is for a `shoal train --fault-tolerance` command (a lost node's groups start again there)",
            "drop --spare-nodes, or add --fault-tolerance to the shoal train command",
        )
    nproc = args.nproc if args.nproc is not None else max(1, args.gpus_per_node)
    python = args.python or sys.executable
    spec = JobSpec(
        command=args.command,
        nodes=args.nodes,
        nproc=nproc,
        gpus_per_node=args.gpus_per_node,
        job_name=args.job_name,
        workdir=args.workdir,
        max_restarts=args.max_restarts,
        master_port=args.master_port,
        env=parse_env(env_items(args)),
        python=python,
        shoal=(python, "-m", "shoal"),
    )
    opts = SlurmOptions(
        partition=args.partition,
        time_limit=args.time_limit,
        output=args.output,
        error=args.error,
        cpus_per_node=args.cpus_per_node,
        one_task_per_process=args.one_task_per_process,
        spare_nodes=args.spare_nodes,
    )
    if opts.one_task_per_process and spec.max_restarts and not replicas:
        raise ShoalError("--max-restarts needs the per-node launchers", "drop --one-task-per-process or --max-restarts")
    script = (render_replica_sbatch if replicas else render_sbatch)(spec, opts)
    warn_missing_script(args.command, args.workdir)
    warn_local_paths(parse_env(args.env), os.environ, where="the nodes", shared_files=True)
    if args.dry_run:
        sys.stdout.write(script)
        return 0
    path = args.script or f"{spec.job_name}.sbatch"
    require_program("sbatch", SBATCH_HINT)
    write_rendered(path, script, SBATCH_MARKER, what="shoal launch slurm", mode=0o755)
    job_id = submit_sbatch(path)
    output = opts.output.replace("%j", job_id)
    announce(f"submitted batch job {job_id} (script {path}, output {output}); watch it with `squeue -j {job_id}`")
    print(job_id, flush=True)
    return 0
