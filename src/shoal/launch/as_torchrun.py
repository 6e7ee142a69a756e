"""Run a command with torchrun's variables, derived from the launcher that started this process.

``python -m shoal.launch.as_torchrun [--ranks-per-node N,N,...] -- COMMAND...`` reads where this
process sits in its job from the launcher's own variables (Open MPI's ``OMPI_COMM_WORLD_*``, an srun
step's ``SLURM_*``: :func:`shoal.env.detect.detect_environment`), exports the variables torchrun
gives every worker (:func:`torchrun_variables`) and ``exec``s COMMAND in this same process.

Why a shim per rank rather than one ``shoal run`` agent per host under mpirun: the process stays the
MPI rank mpirun started (same PID, same OMPI_* variables), so Open MPI's process model is untouched:
its mapping and binding flags mean what they say, its signals and exit codes reach the script, and
scripts that use MPI themselves (mpi4py, Horovod-style) keep working beside torchrun-style ones.
An agent per host would hide the ranks from mpirun and make MPI-using scripts impossible.

``--ranks-per-node``: the ranks on each node in node order, when they differ between nodes (hosts
with different slot counts): the launchers' variables give the local rank and size but not the
node's index, which is otherwise ``rank // local size`` (exact when every node has as many ranks).
A launcher whose variables are missing or inconsistent is a one-line error with a HINT (status 2).
Imports no torch: about 0.3 s before the command starts (a busy 2-core machine; ``import torch``
alone takes 2-4 s there).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from shoal.errors import ShoalError
from shoal.launch.exit_hook import add_exit_hook, add_horovod_shim
from shoal.launch.tf_config import add_tf_config

MODULE = "shoal.launch.as_torchrun"

_USAGE_HINT = "python -m shoal.launch.as_torchrun [--ranks-per-node 2,1] -- PROGRAM ARGS..."


def torchrun_variables(environ: Mapping[str, str], ranks_per_node: Sequence[int] = ()) -> dict[str, str]:
    """What torchrun would export to this worker, from the launcher variables in ``environ``.

    RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE (nodes), ROLE_RANK,
    ROLE_WORLD_SIZE, ROLE_NAME (one role, as torchrun's), MASTER_ADDR, MASTER_PORT,
    TORCHELASTIC_RUN_ID (the launcher's job id: the same on every rank), TORCHELASTIC_RESTART_COUNT
    and TORCHELASTIC_MAX_RESTARTS (0: these launchers do not restart a group), and OMP_NUM_THREADS
    unless ``environ`` sets it (usable cores // ranks on this node, as ``shoal run`` sets it);
    and SHOAL_ENV naming the launcher's scheme, unless set (``shoal.init()`` reports what started it).
    """
    from shoal.env.detect import detect_environment, torch_env_vars
    from shoal.env.host import threads_per_process

    info = detect_environment(environ, argv=[])
    variables = torch_env_vars(info)
    if ranks_per_node:
        variables.update(_node_of(info.rank, info.world_size, ranks_per_node))
    variables.update(
        ROLE_RANK=str(info.rank),
        ROLE_WORLD_SIZE=str(info.world_size),
        ROLE_NAME="default",
        TORCHELASTIC_RUN_ID=environ.get("TORCHELASTIC_RUN_ID") or _run_id(environ),
        TORCHELASTIC_RESTART_COUNT=environ.get("TORCHELASTIC_RESTART_COUNT", "0"),
        TORCHELASTIC_MAX_RESTARTS=environ.get("TORCHELASTIC_MAX_RESTARTS", "0"),
    )
    variables["OMP_NUM_THREADS"] = environ.get("OMP_NUM_THREADS") or str(threads_per_process(info.local_world_size))
    # torchrun's variables would make shoal's own detection (torchrun first) call this process a
    # torchrun worker; SHOAL_ENV keeps shoal.init() seeing the launcher that really started it.
    if environ.get("SHOAL_ENV", "").strip().lower() in ("", "auto"):
        variables["SHOAL_ENV"] = info.scheme
    return variables


def _node_of(rank: int, world: int, ranks_per_node: Sequence[int]) -> dict[str, str]:
    """GROUP_RANK and GROUP_WORLD_SIZE of ``rank`` when nodes ``i`` hold ``ranks_per_node[i]`` ranks in turn."""
    if sum(ranks_per_node) != world:
        raise ShoalError(
            f"--ranks-per-node {','.join(map(str, ranks_per_node))} adds up to {sum(ranks_per_node)}, "
            f"but the launcher started {world} ranks",
            "give each node's rank count in node order (shoal launch renders it from --hosts)",
        )
    first = 0
    for node, count in enumerate(ranks_per_node):
        if rank < first + count:
            return {"GROUP_RANK": str(node), "GROUP_WORLD_SIZE": str(len(ranks_per_node))}
        first += count
    raise AssertionError("rank < world")  # pragma: no cover


def _run_id(environ: Mapping[str, str]) -> str:
    """One id for the whole job: Open MPI's job id, or the Slurm job and step, else ``shoal``."""
    from shoal.env.openmpi import mpirun_run_id
    from shoal.env.slurm import step_run_id

    return mpirun_run_id(environ) or step_run_id(environ) or "shoal"


def parse_argv(argv: Sequence[str]) -> tuple[tuple[int, ...], list[str]]:
    """``([--ranks-per-node N,...] [--] COMMAND...)`` -> (ranks per node, command)."""
    args = list(argv)
    ranks: tuple[int, ...] = ()
    if args[:1] == ["--ranks-per-node"]:
        try:
            ranks = tuple(int(n) for n in args[1].split(","))
        except (IndexError, ValueError):
            raise ShoalError("--ranks-per-node needs counts like 2,1", _USAGE_HINT) from None
        if any(n < 1 for n in ranks):
            raise ShoalError(f"--ranks-per-node {args[1]}: every node needs at least 1 rank", _USAGE_HINT)
        args = args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        raise ShoalError("no command to run", _USAGE_HINT)
    return ranks, args


def environment_for(
    command_env: Mapping[str, str], command: Sequence[str], ranks_per_node: Sequence[int] = ()
) -> dict[str, str]:
    """The environment a rank's ``command`` starts with: ``command_env`` with torchrun's variables
    added (see :func:`torchrun_variables`) and, when the command is this Python, the exit hook
    (:mod:`shoal.launch.exit_hook`: a gloo group left open is left at exit); with
    ``SHOAL_HOROVOD_SHIM=1``, this installation's Horovod shim first on ``PYTHONPATH``; with ``SHOAL_TF_CONFIG=1``,
    ``TF_CONFIG`` too, its addresses exchanged through a store rank 0 serves at MASTER_ADDR:MASTER_PORT
    (:func:`shoal.launch.tf_config.add_tf_config`: every rank waits there for the others). The one
    recipe for every rank shoal starts under another launcher, exec'd here or run by
    :mod:`shoal.jobs.hosts.rank_status`; the command is to start right after it returns."""
    env = {**command_env, **torchrun_variables(command_env, ranks_per_node)}
    add_horovod_shim(env)
    add_exit_hook(env, command[0])
    add_tf_config(env, serve=True)
    return env


def main(argv: Sequence[str] | None = None) -> int:
    try:
        ranks, command = parse_argv(sys.argv[1:] if argv is None else argv)
        env = environment_for(os.environ, command, ranks)
    except ShoalError as err:
        print(err.format(), file=sys.stderr, flush=True)
        return err.exit_code
    try:
        os.execvpe(command[0], command, env)
    except OSError as err:
        print(f"shoal: cannot run {command[0]}: {err.strerror}", file=sys.stderr, flush=True)
        return 127
    raise AssertionError("exec returned")  # pragma: no cover


if __name__ == "__main__":
    raise SystemExit(main())
