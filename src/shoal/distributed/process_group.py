"""Joining and leaving the default process group: short join timeout, readable failures.

:func:`join_process_group` is ``init_process_group`` with a join timeout measured in a minute, not
torch's half hour, and an error that names the rank, the endpoint and what to check. Across nodes
it first makes gloo/NCCL use the interface that routes to the main address (see
:func:`choose_socket_interface`). :func:`destroy_process_group` leaves the group without the abort
at exit that torch 2.14's gloo showed.
"""

from __future__ import annotations

import gc
import os
import re
import sys
from datetime import timedelta

import torch.distributed as dist

from shoal.env import EnvInfo
from shoal.env.network import bracket
from shoal.errors import ShoalError

DEFAULT_INIT_TIMEOUT_S = 60.0
"""Joining the process group fails after this long: a missing rank is reported in about a minute."""
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0
"""A collective that waits longer than this is a hang (torch's own default for gloo is 30 minutes)."""


def join_process_group(info: EnvInfo, backend: str, *, init_timeout: float, timeout: float) -> None:
    """``init_process_group`` with a short join timeout and an error that names what is missing."""
    endpoint = f"{bracket(info.main_address)}:{info.main_port}"
    if os.environ.get("TORCHELASTIC_RUN_ID") is not None or info.scheme == "torchrun":
        # torchrun's agent already runs the store and exported MASTER_*; env:// reuses it.
        init_method = "env://"
    else:
        init_method = f"tcp://{endpoint}"
    choose_socket_interface(info, backend)
    try:
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=info.rank,
            world_size=info.world_size,
            timeout=timedelta(seconds=init_timeout),
        )
    except Exception as err:  # torch raises DistStoreError, RuntimeError, ValueError here
        raise _join_error(err, info, endpoint, init_timeout) from None
    # The short timeout was for joining; collectives get the longer one.
    if hasattr(dist, "set_timeout"):
        dist.set_timeout(timedelta(seconds=timeout))


def _join_error(err: Exception, info: EnvInfo, endpoint: str, init_timeout: float) -> ShoalError:
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    who = f"rank {info.rank} of {info.world_size}"
    if "address already in use" in text.lower() or "EADDRINUSE" in text:
        return ShoalError(
            f"rank 0 could not listen on {endpoint}: the port is already in use",
            "choose another MASTER_PORT (or let `shoal run` pick a free one)",
        )
    if "connectFullMesh" in str(err) or "GLOO_SOCKET_IFNAME" in str(err):
        return ShoalError(
            f"{who} reached the store at {endpoint} but not its peers: {text[:160]}",
            "gloo advertised an address the other nodes cannot reach (often 127.0.0.1 from /etc/hosts): "
            "set GLOO_SOCKET_IFNAME (NCCL_SOCKET_IFNAME on GPUs) to the interface that routes between nodes",
        )
    if "timeout" in text.lower() or "timed out" in text.lower():
        missing = _missing_peer(text, info)
        if missing is not None:
            found = f": rank {missing} never arrived"
            hint = f"rank {missing} was not started or is stuck before joining: read its output (its node's log)"
        else:
            arrived = _ARRIVED.search(text)
            found = f": {arrived[1]} of {arrived[2]} ranks arrived" if arrived else ""
            hint = (
                f"check that every rank was started and that {endpoint} is reachable from node "
                f"{info.node_rank} (MASTER_ADDR, firewall)"
            )
        return ShoalError(
            f"{who} timed out after {init_timeout:.0f} s joining the process group at {endpoint} ({info.scheme}){found}",
            f"{hint}; wait longer with SHOAL_INIT_TIMEOUT",
        )
    return ShoalError(
        f"{who} could not join the process group at {endpoint}: {text}",
        f"check MASTER_ADDR/MASTER_PORT and that {endpoint} is reachable from node {info.node_rank}",
    )


_AWAITED_KEY = re.compile(r"wait timeout after \d+ms, keys: /default_pg/\S*/(\d+)$")
"""gloo's full mesh: each rank publishes its address in the store under a key ending in its rank, and
waits for its peers' keys in turn (torch 2.15: "wait timeout after 60000ms, keys:
/default_pg/0//cpu//0/2" for a missing rank 2, on every rank that waited)."""
_ARRIVED = re.compile(r"(\d+)/(\d+) clients joined")
"""The TCPStore that rank 0 hosts for tcp:// counts who connected ("2/3 clients joined")."""


def _missing_peer(text: str, info: EnvInfo) -> int | None:
    """The rank this one waited for when it timed out, if the store was the launcher's.

    Only then: with tcp://, rank 0 hosts the store and publishes nothing until every rank has
    connected, so the others' wait names rank 0 whichever rank is missing."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    match = _AWAITED_KEY.search(text)
    if match is None or int(match[1]) == info.rank or int(match[1]) >= info.world_size:
        return None
    return int(match[1])


def choose_socket_interface(info: EnvInfo, backend: str) -> None:
    """Across nodes, make gloo/NCCL use the interface that routes to the main address.

    Where the host name resolves to 127.0.0.1 (common in /etc/hosts), gloo would advertise
    loopback to the other nodes and the job would fail in connectFullMesh. Launchers that start
    the ranks directly (mpirun, srun, pods) do not set the variable; `shoal run` does already.
    """
    var = "NCCL_SOCKET_IFNAME" if backend == "nccl" else "GLOO_SOCKET_IFNAME"
    if info.num_nodes <= 1 or var in os.environ:
        return
    from shoal.env.network import route_to

    route = route_to(info.main_address)
    if route.ifname and not route.loopback:
        os.environ[var] = route.ifname
        if info.rank == 0 or info.local_rank == 0:
            print(f"shoal: node {info.node_rank}: {var}={route.ifname} ({route.why})", file=sys.stderr, flush=True)


def destroy_process_group() -> None:
    """Leave the default process group, then run a full garbage collection before going on.

    With torch 2.14 and gloo, a worker thread of the group releases the tensors of a finished
    collective a moment after the collective returns; that needs the GIL. If the interpreter has
    begun shutting down by then, the thread is killed mid-C++ and the process dies of SIGABRT
    ("terminate called without an active exception") after all its work is done: about 1 run in
    8 of a two-rank DDP script here (21 of 175 runs). With the collection right after
    ``dist.destroy_process_group()`` it happened in none of 180 runs. The group's threads are
    still alive afterwards (the collection does not free them); what it buys is time in which
    they get the GIL while the interpreter is whole. A mitigation measured, not a proof.
    """
    dist.destroy_process_group()
    gc.collect()
