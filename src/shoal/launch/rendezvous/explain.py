"""A rendezvous that failed, told as one line naming the endpoint, the arrivals and what to do.

torch reports a failed rendezvous as whatever its store or handler raised (a timeout, a refused
connection, "2/3 clients joined"); :func:`explain_failure` turns it, with the plan that was
followed, into a :class:`~shoal.errors.ShoalError` with a hint. A node stopped because another
node failed exits with :data:`~shoal.errors.EXIT_ANOTHER_NODE_FAILED`, so whoever gathers the
nodes' statuses can tell the cause from its consequences.
"""

from __future__ import annotations

import re

from shoal.env.network import probe_tcp
from shoal.errors import EXIT_ANOTHER_NODE_FAILED, ShoalError, first_line
from shoal.launch.rendezvous.handlers import JoinFailed, NodeLeft
from shoal.launch.rendezvous.plan import RendezvousPlan
from shoal.launch.rendezvous.stores import StoreUnreachable

_CLIENTS_JOINED = re.compile(r"(\d+)/(\d+) clients joined")


def explain_failure(err: BaseException, plan: RendezvousPlan) -> ShoalError:
    """A rendezvous that failed, as one ShoalError naming the endpoint, the arrivals and a hint."""
    if isinstance(err, NodeLeft):
        return ShoalError(
            f"{err}; this node's workers were stopped",
            "the node where a worker failed shows that rank's traceback; look there",
            exit_code=EXIT_ANOTHER_NODE_FAILED,
        )
    arrived: int | None = None
    expected = plan.max_nodes
    if isinstance(err, JoinFailed):
        arrived, expected = err.arrived, err.expected
        detail = ""
    elif isinstance(err, StoreUnreachable):
        detail = str(err)
    else:
        detail = first_line(err)
        match = _CLIENTS_JOINED.search(detail)
        if match:  # static, on node 0: torch's TCPStore counted the nodes that connected
            arrived, expected = int(match.group(1)), int(match.group(2))
    within = f"within {plan.join_timeout:g} s"
    where = f"the {plan.backend} rendezvous at {plan.endpoint}"
    same = "the same --nnodes, rendezvous address and port" + (
        " (and each its own --node-rank)" if plan.backend == "static" else ""
    )
    if arrived is not None:
        need = f"{plan.min_nodes}" if plan.min_nodes != plan.max_nodes else f"{expected}"
        return ShoalError(
            f"only {arrived} of {need} nodes arrived at {where} {within}",
            f"start the missing node(s) with {same}, check that they reach {plan.endpoint}, or "
            "wait longer with --join-timeout",
            exit_code=1,
        )
    if plan.hosts_store:
        return ShoalError(
            f"{where} failed on this node, which hosts it: {detail or type(err).__name__}",
            f"start every node with {same}; raise --join-timeout if nodes start late",
            exit_code=1,
        )
    status = err.status if isinstance(err, StoreUnreachable) else probe_tcp(plan.host, plan.port)
    route = plan.route
    from_here = f" (from {route.addr} on {route.ifname})" if route and route.ifname else ""
    if status == "refused":
        what = f"nothing listens on port {plan.port} of {plan.host}"
        host_node = "node rank 0" if plan.backend == "static" else f"the node that owns {plan.host}"
        hint = (
            f"start {host_node} (it hosts the store), give every node the same port, and check "
            f"that {plan.host} is that node's address"
        )
    elif status in ("timeout", "unreachable"):
        what = f"{plan.host} does not answer{from_here}"
        hint = (
            f"check the rendezvous address ({plan.host} must be the master node's address on a "
            f"network this node shares) and that no firewall blocks port {plan.port}"
        )
    else:
        what = detail or type(err).__name__
        hint = f"start every node with {same}, and check that {plan.endpoint} is reachable from here"
    return ShoalError(f"could not join {where} {within}: {what}", hint, exit_code=1)


def is_rendezvous_failure(err: BaseException) -> bool:
    """True for what torch raises when a rendezvous cannot complete (incl. :class:`JoinFailed`)."""
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    dist_error = getattr(dist, "DistError", RuntimeError)
    return isinstance(err, (JoinFailed, NodeLeft, StoreUnreachable, RendezvousError, TimeoutError, dist_error))
