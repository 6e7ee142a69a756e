"""torchrun (torch's elastic agent) and the legacy ``python -m torch.distributed.launch``.

Matches when ``TORCHELASTIC_RUN_ID`` is set (torchrun sets it for every worker), or when RANK,
WORLD_SIZE, LOCAL_RANK and MASTER_ADDR are all set, or, for the legacy launcher, when RANK,
WORLD_SIZE and MASTER_ADDR are set and the command line carries ``--local_rank=N``,
``--local-rank=N`` or ``--local_rank N`` (that launcher passes the local rank as a flag unless
``--use-env``). ``LOCAL_RANK`` in the environment wins over the flag.

Read: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (node rank; else
``rank // local_world_size``), GROUP_WORLD_SIZE (node count; else ``world_size // local_world_size``
when that divides evenly), MASTER_ADDR, MASTER_PORT (default 29500).

The legacy launcher exports no per-node size. Without LOCAL_WORLD_SIZE the job is taken to be one
node when that is provably so (MASTER_ADDR is a loopback address and ``rank == local_rank``);
otherwise it is an error asking for LOCAL_WORLD_SIZE, because guessing would pick wrong GPUs.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

from shoal.env.base import (
    DEFAULT_MAIN_PORT,
    EnvInfo,
    LaunchEnvironment,
    check_below,
    check_not_above,
    has_all,
    read_int,
    read_port,
    read_rank,
    require,
    seen,
)
from shoal.env.network import is_loopback
from shoal.errors import ShoalError

_FLAGS = ("--local_rank", "--local-rank")
_HINT = "start the script with `torchrun --nproc-per-node N script.py` (or `shoal run`), which sets them all"


def local_rank_flag(argv: Sequence[str]) -> str | None:
    """The value of ``--local_rank``/``--local-rank`` in ``argv`` (``=N`` or ``N`` after it), or None."""
    args = list(argv[1:])
    for i, arg in enumerate(args):
        for flag in _FLAGS:
            if arg.startswith(flag + "="):
                return arg[len(flag) + 1 :]
            if arg == flag and i + 1 < len(args):
                return args[i + 1]
    return None


class TorchrunEnvironment(LaunchEnvironment):
    name = "torchrun"

    @classmethod
    def detect(cls, environ: Mapping[str, str], *, argv: Sequence[str] | None = None) -> bool:
        if "TORCHELASTIC_RUN_ID" in environ or has_all(environ, "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"):
            return True
        argv = sys.argv if argv is None else argv
        return has_all(environ, "RANK", "WORLD_SIZE", "MASTER_ADDR") and local_rank_flag(argv) is not None

    @classmethod
    def describe(cls, environ: Mapping[str, str], *, argv: Sequence[str] | None = None) -> EnvInfo:
        argv = sys.argv if argv is None else argv
        require(environ, cls.name, "RANK", "WORLD_SIZE", "MASTER_ADDR", hint=_HINT)
        rank, world = read_rank(environ, "RANK", "WORLD_SIZE")
        local_name, local_rank = _local_rank(environ, argv)

        if "LOCAL_WORLD_SIZE" in environ:
            local_world = read_int(environ, "LOCAL_WORLD_SIZE", minimum=1)
            check_not_above("LOCAL_WORLD_SIZE", local_world, "WORLD_SIZE", world)
            check_below(local_name, local_rank, "LOCAL_WORLD_SIZE", local_world)
        else:
            local_world = _single_node_size(environ, rank, local_rank, world)

        if "GROUP_WORLD_SIZE" in environ:
            num_nodes = read_int(environ, "GROUP_WORLD_SIZE", minimum=1)
        elif world % local_world == 0:
            num_nodes = world // local_world
        else:
            raise ShoalError(
                f"torchrun: WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={local_world} "
                "and GROUP_WORLD_SIZE is not set",
                "set GROUP_WORLD_SIZE to the number of nodes (torchrun sets it itself)",
            )
        node_rank = read_int(environ, "GROUP_RANK") if "GROUP_RANK" in environ else rank // local_world
        nodes_name = "GROUP_WORLD_SIZE" if "GROUP_WORLD_SIZE" in environ else "WORLD_SIZE/LOCAL_WORLD_SIZE"
        check_below(
            "GROUP_RANK" if "GROUP_RANK" in environ else "RANK/LOCAL_WORLD_SIZE", node_rank, nodes_name, num_nodes
        )

        names = (
            "TORCHELASTIC_RUN_ID",
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "GROUP_RANK",
            "GROUP_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
        )
        reason = seen(environ, *names)
        if local_name != "LOCAL_RANK":
            reason += (f"argv {local_name}={local_rank}",)
        return EnvInfo(
            scheme=cls.name, rank=rank, local_rank=local_rank, world_size=world, local_world_size=local_world,
            node_rank=node_rank, num_nodes=num_nodes, main_address=environ["MASTER_ADDR"],
            main_port=read_port(environ, "MASTER_PORT", DEFAULT_MAIN_PORT), reason=reason,
        )  # fmt: skip


def _local_rank(environ: Mapping[str, str], argv: Sequence[str]) -> tuple[str, int]:
    """(where it came from, value): LOCAL_RANK, else the legacy ``--local_rank`` flag."""
    if "LOCAL_RANK" in environ:
        return "LOCAL_RANK", read_int(environ, "LOCAL_RANK")
    flag = local_rank_flag(argv)
    if flag is None:
        raise ShoalError("torchrun: LOCAL_RANK not set and no --local_rank argument", _HINT)
    try:
        value = int(flag)
    except ValueError:
        raise ShoalError(f"--local_rank={flag!r} is not an integer", _HINT) from None
    if value < 0:
        raise ShoalError(f"--local_rank={flag!r} is below 0", _HINT)
    return "--local_rank", value


def _single_node_size(environ: Mapping[str, str], rank: int, local_rank: int, world: int) -> int:
    """LOCAL_WORLD_SIZE for the legacy launcher, which does not export it: only a provable single node."""
    address = environ["MASTER_ADDR"]
    if is_loopback(address) and rank == local_rank:
        return world
    raise ShoalError(
        f"LOCAL_WORLD_SIZE not set (legacy torch.distributed.launch?) and MASTER_ADDR={address} with "
        f"RANK={rank}, local rank {local_rank} does not prove a single node",
        "export LOCAL_WORLD_SIZE=<processes per node> before launching, or launch with torchrun "
        "(one process per machine and a --local_rank argument of your own: SHOAL_ENV=kubeflow)",
    )
