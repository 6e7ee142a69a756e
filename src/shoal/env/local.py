"""A plain ``python script.py``: the fallback that always matches.

One process: rank 0 of 1 on one node, rendezvous on 127.0.0.1 at MASTER_PORT (default 29500).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shoal.env.base import LOOPBACK, EnvInfo, LaunchEnvironment, read_port


class LocalEnvironment(LaunchEnvironment):
    name = "local"

    @classmethod
    def detect(cls, environ: Mapping[str, str], *, argv: Sequence[str] | None = None) -> bool:
        return True

    @classmethod
    def describe(cls, environ: Mapping[str, str], *, argv: Sequence[str] | None = None) -> EnvInfo:
        return EnvInfo(
            scheme=cls.name,
            rank=0,
            local_rank=0,
            world_size=1,
            local_world_size=1,
            node_rank=0,
            num_nodes=1,
            main_address=LOOPBACK,
            main_port=read_port(environ),
            reason=(),
        )
