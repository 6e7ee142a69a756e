"""Slurm job steps: processes started by ``srun``.

When it matches (the false-positive rule). ``sbatch`` runs the batch script once, on the first node,
and ``salloc`` opens a shell; both export the allocation's variables (SLURM_JOB_ID, SLURM_NTASKS,
SLURM_JOB_NODELIST, and in a batch script even SLURM_PROCID=0), so a plain ``python train.py``
there would look like rank 0 of SLURM_NTASKS and wait forever for ranks that never start. Only
``srun`` creates a job step, and only a step exports ``SLURM_STEP_ID`` (and its old name
``SLURM_STEPID``) together with SLURM_STEP_NUM_TASKS and SLURM_STEP_TASKS_PER_NODE (Slurm's
``env_array_for_step``). So slurm matches when SLURM_PROCID and SLURM_STEP_ID/SLURM_STEPID are set
and the step id is a real step, not one of Slurm's special ids: 4294967290 (the interactive step
of ``salloc`` with ``use_interactive_step`` or ``srun --pty bash``: one shell, so a ``python`` run
in it is a single local process), 4294967291 (batch) or 4294967292 (extern).
A ``torchrun`` inside an sbatch script or an srun step is caught earlier by the torchrun scheme.

``mpirun``/``mpiexec`` inside an allocation start their daemons with ``srun``, one per node, so
the MPI ranks inherit that step's variables (SLURM_PROCID then counts daemons, not ranks). Slurm
therefore does not match when Open MPI's OMPI_COMM_WORLD_SIZE is set, nor when a PMI launcher's
PMI_SIZE differs from the step's task count (``srun --mpi=pmi2`` sets PMI_SIZE equal to it).

Read: rank SLURM_PROCID; world SLURM_STEP_NUM_TASKS (else SLURM_NTASKS, SLURM_NPROCS); local rank
SLURM_LOCALID; node rank SLURM_NODEID (relative to the step); nodes SLURM_STEP_NUM_NODES (else
SLURM_NNODES, which srun sets for the step, else SLURM_JOB_NUM_NODES); processes on this node: the
SLURM_NODEID-th entry of SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE), in Slurm's
compressed form ``2(x3),1``, else world / nodes when even.

Main address: MASTER_ADDR if set, else the first host of SLURM_STEP_NODELIST (else SLURM_NODELIST,
which srun sets to the step's nodes, else SLURM_JOB_NODELIST): task 0 runs on the step's first node.
Port: MASTER_PORT if set, else ``15000 + SLURM_JOB_ID % 5000`` (in 15000-19999): every task of a
job computes the same port with no communication, and jobs sharing a node get different ports unless
their ids differ by a multiple of 5000. Without SLURM_JOB_ID, 29500.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shoal.env.base import (
    DEFAULT_MAIN_PORT,
    EnvInfo,
    LaunchEnvironment,
    check_below,
    first_set,
    read_int,
    read_port,
    read_rank,
    require,
    seen,
)
from shoal.env.hostlist import expand_counts, expand_hostlist
from shoal.errors import ShoalError

PORT_BASE = 15000
PORT_SPAN = 5000
SPECIAL_STEP_IDS = {"4294967290", "4294967291", "4294967292"}  # interactive, batch, extern
_HINT = "start one task per process with srun, e.g. `srun --ntasks-per-node=4 python train.py`"


def slurm_port(job_id: int) -> int:
    """The rendezvous port of Slurm job ``job_id``: ``15000 + job_id % 5000``."""
    return PORT_BASE + job_id % PORT_SPAN


class SlurmEnvironment(LaunchEnvironment):
    name = "slurm"

    @classmethod
    def detect(cls, environ: Mapping[str, str], *, argv: Sequence[str] | None = None) -> bool:
        step = first_set(environ, "SLURM_STEP_ID", "SLURM_STEPID")
        if step is None or "SLURM_PROCID" not in environ or environ[step].strip() in SPECIAL_STEP_IDS:
            return False
        if "OMPI_COMM_WORLD_SIZE" in environ:
            return False
        tasks = first_set(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
        # srun --mpi=pmi2 sets PMI_SIZE to the step's task count; another value is an MPI launcher's.
        return "PMI_SIZE" not in environ or (
            tasks is not None and environ["PMI_SIZE"].strip() == environ[tasks].strip()
        )

    @classmethod
    def describe(cls, environ: Mapping[str, str], *, argv: Sequence[str] | None = None) -> EnvInfo:
        step = first_set(environ, "SLURM_STEP_ID", "SLURM_STEPID") or "SLURM_STEP_ID"
        require(environ, cls.name, step, "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", hint=_HINT)
        tasks_name = first_set(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
        nodes_name = first_set(environ, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
        if tasks_name is None or nodes_name is None:
            missing = [
                n
                for n, found in (("SLURM_STEP_NUM_TASKS", tasks_name), ("SLURM_STEP_NUM_NODES", nodes_name))
                if found is None
            ]
            raise ShoalError(f"slurm: {', '.join(missing)} not set", _HINT)

        rank, world = read_rank(environ, "SLURM_PROCID", tasks_name)
        node_rank, num_nodes = read_rank(environ, "SLURM_NODEID", nodes_name)
        local_rank = read_int(environ, "SLURM_LOCALID")
        local_name, local_world = _tasks_on_node(environ, node_rank, num_nodes, nodes_name, world, tasks_name)
        check_below("SLURM_LOCALID", local_rank, local_name, local_world)

        return EnvInfo(
            scheme=cls.name, rank=rank, local_rank=local_rank, world_size=world, local_world_size=local_world,
            node_rank=node_rank, num_nodes=num_nodes, main_address=_main_address(environ),
            main_port=_main_port(environ), reason=seen(
                environ, "SLURM_JOB_ID", step,
            "SLURM_PROCID", tasks_name, "SLURM_LOCALID", "SLURM_NODEID", nodes_name,
            "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_NODELIST", "MASTER_ADDR", "MASTER_PORT", ),
        )  # fmt: skip


def _tasks_on_node(
    environ: Mapping[str, str], node_rank: int, num_nodes: int, nodes_name: str, world: int, tasks_name: str
) -> tuple[str, int]:
    """(label, count): how many tasks of the step run on node ``node_rank``."""
    name = first_set(environ, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    if name is None:
        if world % num_nodes:
            raise ShoalError(
                f"slurm: SLURM_STEP_TASKS_PER_NODE not set and {tasks_name}={world} does not divide evenly "
                f"over {nodes_name}={num_nodes}",
                _HINT,
            )
        return f"{tasks_name}/{nodes_name}", world // num_nodes
    try:
        counts = expand_counts(environ[name])
    except ValueError as err:
        raise ShoalError(f"{name}={environ[name]!r} is malformed: {err}", "it should look like 2(x3),1") from None
    if len(counts) != num_nodes or sum(counts) != world:
        raise ShoalError(
            f"{name}={environ[name]!r} gives {sum(counts)} tasks on {len(counts)} nodes, "
            f"but {tasks_name}={world} and {nodes_name}={num_nodes}",
            "the Slurm variables disagree; check that none is exported by hand in the job script",
        )
    return f"{name}[{node_rank}]", counts[node_rank]


def _main_address(environ: Mapping[str, str]) -> str:
    if "MASTER_ADDR" in environ:
        return environ["MASTER_ADDR"]
    name = first_set(environ, "SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST")
    if name is None:
        raise ShoalError(
            "slurm: none of SLURM_STEP_NODELIST, SLURM_NODELIST, SLURM_JOB_NODELIST, MASTER_ADDR is set",
            "export MASTER_ADDR=<first node> in the job script, or launch with srun",
        )
    try:
        return expand_hostlist(environ[name])[0]
    except ValueError as err:
        raise ShoalError(
            f"{name}={environ[name]!r} is malformed: {err}", "export MASTER_ADDR=<first node> to bypass the host list"
        ) from None


def allocation_beyond(environ: Mapping[str, str], nproc: int) -> str | None:
    """``NAME=value`` of the Slurm allocation variable that asks for more than ``nproc`` processes on
    one node (several nodes, or more tasks), or None (no allocation, or it fits). Counts that are
    unset or not plain numbers read as 1 (Slurm writes ``2(x3)`` forms elsewhere)."""
    if "SLURM_JOB_ID" not in environ:
        return None
    nodes_name = first_set(environ, "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
    nodes = _count(environ, nodes_name)
    tasks = _count(environ, "SLURM_NTASKS")
    if nodes > 1:
        return f"{nodes_name}={nodes}"
    return f"SLURM_NTASKS={tasks}" if tasks > nproc else None


def allocation_first_node(environ: Mapping[str, str]) -> str | None:
    """The first node of the Slurm allocation (SLURM_JOB_NODELIST), where rank 0 of an mpirun
    inside it runs; None outside an allocation. ShoalError when the host list is malformed."""
    nodelist = environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        return None
    try:
        return expand_hostlist(nodelist)[0]
    except ValueError as err:
        raise ShoalError(
            f"SLURM_JOB_NODELIST={nodelist!r} is malformed: {err}", "give --master-addr <first node of the allocation>"
        ) from None


def step_run_id(environ: Mapping[str, str]) -> str | None:
    """``slurm-JOB.STEP`` for the Slurm job step this process belongs to, or None outside Slurm."""
    if "SLURM_JOB_ID" not in environ:
        return None
    return f"slurm-{environ['SLURM_JOB_ID']}.{environ.get('SLURM_STEP_ID', '0')}"


def _count(environ: Mapping[str, str], name: str | None) -> int:
    value = environ.get(name or "", "").strip()
    return int(value) if value.isdigit() else 1


def _main_port(environ: Mapping[str, str]) -> int:
    if "MASTER_PORT" in environ or "SLURM_JOB_ID" not in environ:
        return read_port(environ, "MASTER_PORT", DEFAULT_MAIN_PORT)
    return slurm_port(read_int(environ, "SLURM_JOB_ID"))
