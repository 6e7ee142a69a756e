"""A fault-tolerant job on Slurm: one job step per replica group, the lighthouse on the batch host.

``shoal launch slurm ... -- shoal train WORKLOAD --fault-tolerance --out DIR`` renders a batch script
(:func:`render_replica_sbatch`) in which

- every replica group is a job step of its own (``srun --nodes=1 --ntasks=1 --exact``, started in
  the background), running ``shoal train ... --nnodes N --node-rank G`` as exactly group G of N:
  its launcher forks the group and restarts its process in place, as on any node
  (docs/FAULT_TOLERANCE.md, "Across nodes");
- the script starts a group's step again when it fails (up to ``--max-restarts`` times, default
  :data:`MAX_RESTARTS`), and Slurm places it on any node of the allocation with free CPUs: a step
  on a node that is lost is killed, and ``#SBATCH --no-kill`` keeps the allocation (sbatch(1),
  Slurm 22.05: "The job allocation will not be revoked so the user may launch new job steps on
  the remaining nodes"). ``--spare-nodes K`` allocates K nodes more than the groups fill, where a
  lost node's groups find free CPUs at once;
- a step that exits with status 2 (shoal's for a ShoalError: bad input, which every group would
  hit, or a group out of its restarts) is not started again: the script stops the others and exits 2;
- torchft's lighthouse runs in the batch script, on the batch host, outside every group, bound to
  that host's address (never ``0.0.0.0``/``[::]``) and restarted when it dies
  (:mod:`shoal.train.ft.serve_lighthouse`); the groups get ``--lighthouse http://ADDR:PORT``. The batch
  host is the one node the job cannot lose: the script runs there (sbatch(1): "Slurm runs a single
  copy of the batch script on the first node").

Everything that cannot work is refused before anything is written (:func:`check`).
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.env.replica import STARTS_ENV
from shoal.errors import ShoalError
from shoal.jobs.slurm import SBATCH_MARKER, SlurmOptions, continued, exports, port_line, sbatch_head
from shoal.jobs.spec import JobSpec, shoal_train_args, train_option

MAX_RESTARTS = 10
"""Starts again of one group's step when ``--max-restarts`` is not given: shoal's own
``DEFAULT_MAX_RESTARTS`` for a group's process (:mod:`shoal.train.ft.supervisor`, which ``jobs``
does not import; a test holds the two equal)."""
BAD_INPUT = 2
"""A step's exit status that ends the job: ``shoal train``'s for a ShoalError."""
LIGHTHOUSE_MODULE = "shoal.train.ft.serve_lighthouse"
_SET_HERE = ("--nnodes", "--node-rank", "--nproc", "--master-addr", "--master-port", "--local-addr", "--rdzv-backend")
"""Flags of the command that the script sets for each step, or that no step could keep (a step
lands on any node)."""
# The step's start count: its launcher numbers its group's starts from it (shoal status, the healed
# line's "it died at step N"), and counts them against --max-restarts.
_STARTS = f"{STARTS_ENV}=$((restarts[$1] + 1))"
_SHELL_WORDS = frozenset({'"$1"', '"$head_addr"', '"$lighthouse"', '"$head_addr:$port"', _STARTS})


@dataclass(frozen=True)
class Layout:
    """The replica groups of a job: how many, how many share a node, their processes and cores."""

    groups: int
    per_node: int
    nproc: int
    """Processes of one group (``--nproc-per-group``, default 1)."""
    cpus: int
    """Cores of one group's step."""


def check(spec: JobSpec, opts: SlurmOptions) -> Layout:
    """What a fault-tolerant sbatch job cannot be, refused before anything is written; its layout."""
    if opts.one_task_per_process:
        raise ShoalError(
            "--one-task-per-process with --fault-tolerance: each replica group is a job step of its own already",
            "drop --one-task-per-process",
        )
    if spec.gpus_per_node or train_option(spec.command, "--device") == "cuda":
        raise ShoalError(
            "--fault-tolerance runs on the CPU for now, but the job asks for GPUs",
            "drop --gpus-per-node and --device cuda (docs/FAULT_TOLERANCE.md says what is built)",
        )
    if train_option(spec.command, "--out") is None:
        raise ShoalError(
            "--fault-tolerance on Slurm needs --out in the command: a group's step may start again on any node",
            "pass --out DIR on storage every node sees (the run's records and checkpoints live there)",
        )
    given = [flag for flag in _SET_HERE if _names(spec.command, flag)]
    if given:
        raise ShoalError(
            f"{given[0]} in a fault-tolerant command on Slurm: the script gives each group's step its own",
            "drop it; --nodes and --nproc-per-node say how many replica groups run (one per process)",
        )
    given_nproc = train_option(spec.command, "--nproc-per-group") or "1"
    if not given_nproc.isdigit() or int(given_nproc) < 1:
        raise ShoalError(
            f"--nproc-per-group {given_nproc!r} is not a whole number of at least 1", "pass --nproc-per-group 1 or more"
        )
    nproc = int(given_nproc)
    per_node, rest = divmod(spec.local_world_size, nproc)
    if rest or not per_node:
        raise ShoalError(
            f"--nproc-per-node {spec.local_world_size} is not a whole number of groups of --nproc-per-group {nproc}",
            f"give --nproc-per-node {nproc * max(1, per_node)} (a multiple of {nproc})",
        )
    groups = spec.nodes * per_node
    if groups < 2:
        raise ShoalError(
            "--fault-tolerance with one replica group has nobody to fail over to",
            "give --nodes 2 (a group per node), or --nproc-per-node 2 (two groups on one node)",
        )
    cpus = max(1, opts.cpus_per_node // per_node) if opts.cpus_per_node else nproc
    return Layout(groups, per_node, nproc, cpus)


def render_replica_sbatch(spec: JobSpec, opts: SlurmOptions) -> str:
    """The batch script of a ``shoal train ... --fault-tolerance`` command (module docstring)."""
    layout = check(spec, opts)
    own = train_option(spec.command, "--lighthouse") is not None
    spare = f"; {opts.spare_nodes} spare node{'s' if opts.spare_nodes != 1 else ''}" if opts.spare_nodes else ""
    lines = sbatch_head(
        spec, opts, nodes=spec.nodes + opts.spare_nodes, tasks_per_node=layout.per_node, cpus_per_task=layout.cpus,
        behaviour=["--no-kill"],
    )  # fmt: skip
    lines += [
        f"{SBATCH_MARKER} for `shoal train --fault-tolerance`: {layout.groups} replica groups, each a job step",
        f"# of its own, started again when it fails (up to {spec.max_restarts} times; never after status "
        f"{BAD_INPUT}: bad input),",
        f"# on any node of the allocation still up (--no-kill: a lost node does not end the job{spare}).",
        "# The groups use the command's own lighthouse."
        if own
        else "# torchft's lighthouse runs here, on the batch host, outside every group; restarted when it dies.",
        "set -eu",
        "",
        *exports(spec),
        port_line(spec),
        f"head_addr=$({spec.python} -m {LIGHTHOUSE_MODULE} --address)  # this host, as the other nodes reach it",
    ]
    serve = continued(
        [spec.python, "-m", LIGHTHOUSE_MODULE, "--bind", '"$head_addr:$port"', "--groups", str(layout.groups)],
        shell_words=_SHELL_WORDS,
    )
    train = [*spec.shoal, "train", *(shoal_train_args(spec.command) or [])]
    place = ["--nnodes", str(layout.groups), "--node-rank", '"$1"', "--nproc", str(layout.nproc)]
    place += ["--master-addr", '"$head_addr"', *([] if own else ["--lighthouse", '"$lighthouse"'])]
    srun = [_STARTS, "srun", "--nodes=1", "--ntasks=1", f"--cpus-per-task={layout.cpus}", "--exact", "--mem=0"]
    fields = {"groups": layout.groups, "max_restarts": spec.max_restarts, "bad_input": BAD_INPUT}
    text = "\n".join(lines) + "\n"
    text += _OWN_LIGHTHOUSE.format(**fields) if own else _LIGHTHOUSE.format(serve=serve, **fields)
    text += _GROUPS.format(srun=_indented(continued(srun, train, place, shell_words=_SHELL_WORDS)), **fields)
    loop = _LOOP.format(**fields)
    if own:  # nothing of the lighthouse's to watch, stop or wait for
        loop = "\n".join(line for line in loop.splitlines() if "lighthouse" not in line) + "\n"
    return text + loop


# The script's parts after its head, in order (str.format: {{ }} are the shell's braces).
_LIGHTHOUSE = """\
lighthouse="http://$head_addr:$port"
echo "shoal: job $SLURM_JOB_ID, {groups} replica groups, one job step each; lighthouse $lighthouse"

serve_lighthouse() {{  # torchft's quorum server: supervised, on this host's address only
    {serve} &
    lighthouse_pid=$!
}}

"""
_OWN_LIGHTHOUSE = """\
echo "shoal: job $SLURM_JOB_ID, {groups} replica groups, one job step each"

"""
_GROUPS = """\
start_group() {{  # group $1 of {groups}, a job step of its own on any node with free CPUs
{srun} &
    step[$1]=$!
}}

stop_steps() {{  # srun passes SIGTERM on to its task, whose launcher stops its group
    local other
    for other in "${{!step[@]}}"; do kill -TERM "${{step[other]}}" 2>/dev/null || true; done
    for other in "${{!step[@]}}"; do wait "${{step[other]}}" || true; done
}}

"""
_LOOP = """\
serve_lighthouse
declare -a step restarts
for ((group = 0; group < {groups}; group++)); do
    restarts[group]=0
    start_group "$group"
done
finished=0 status=0
while ((${{#step[@]}})); do
    sleep 1
    kill -0 "$lighthouse_pid" 2>/dev/null || {{ echo "shoal: the lighthouse's supervisor exited; starting it again"; serve_lighthouse; }}
    for group in "${{!step[@]}}"; do
        kill -0 "${{step[group]}}" 2>/dev/null && continue
        code=0
        wait "${{step[group]}}" || code=$?
        unset "step[group]"
        if ((code == 0)); then
            finished=1  # the run is complete: no step starts again
        elif ((code == {bad_input})); then  # shoal said why above; every group would say the same
            echo "shoal: replica group $group stopped with status $code; stopping the other groups"
            stop_steps
            kill -TERM "$lighthouse_pid" 2>/dev/null || true
            exit {bad_input}
        elif ((!finished && restarts[group] < {max_restarts})); then
            restarts[group]=$((restarts[group] + 1))
            echo "shoal: replica group $group's step exited with status $code;" \\
                "starting it again (${{restarts[group]}}/{max_restarts}), the other groups train on"
            start_group "$group"
        else
            status=$code
            ((finished)) || echo "shoal: replica group $group's step exited with status $code" \\
                "and has no restart left ({max_restarts} used); the other groups train on"
        fi
    done
done
kill -TERM "$lighthouse_pid" 2>/dev/null || true
wait "$lighthouse_pid" || true
exit $((finished ? 0 : status))
"""


def _names(command: tuple[str, ...], flag: str) -> bool:
    """True when the ``shoal train`` command names ``flag`` (``--flag V`` or ``--flag=V``)."""
    return any(word == flag or word.startswith(flag + "=") for word in shoal_train_args(command) or [])


def _indented(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
