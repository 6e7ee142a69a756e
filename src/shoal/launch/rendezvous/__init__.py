"""Multi-node rendezvous, split by concern.

- :mod:`.plan`: the pure planner (options, route and clock in; a frozen plan out);
- :mod:`.stores`: TCP stores that listen on one address;
- :mod:`.handlers`: shoal's rendezvous backends for torch's agent (the only module touching torch's
  private rendezvous internals);
- :mod:`.explain`: a failed rendezvous told as one line with a hint.

:func:`plan_for` is the entry point: the plan for this node, from the options and what this
machine's network says.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping

from shoal.console import write_line
from shoal.env.network import Route, UnresolvedHost, interface_addresses, route_to
from shoal.launch.options import LaunchOptions
from shoal.launch.rendezvous.plan import RendezvousPlan, plan_rendezvous, single_node_plan, store_endpoint

RESOLVE_RETRY_S = 1.0


def plan_for(
    options: LaunchOptions,
    environ: Mapping[str, str] | None = None,
    *,
    started: float | None = None,
    joins: bool = True,
) -> RendezvousPlan:
    """This node's rendezvous plan (single node, or one of several).

    ``started``: ``time.monotonic()`` when the join timeout started counting (default: now).
    ``joins``: False for a look that joins nothing (``shoal env``): no line about waiting to join.
    Raises ShoalError for what cannot work: a master address that never resolves within the join
    timeout, has no route from here, or options that contradict each other.
    """
    environ = os.environ if environ is None else environ
    if not options.several_nodes:
        return single_node_plan(options, environ)
    now = time.monotonic()
    started = now if started is None else started
    host, _ = store_endpoint(options)
    route = find_route(host, deadline=started + options.join_timeout, say_wait=joins)
    named = environ.get("GLOO_SOCKET_IFNAME", "")
    addresses = {name: addrs[0] for name, addrs in interface_addresses().items() if name == named and addrs}
    spent = max(0.0, time.monotonic() - started)
    return plan_rendezvous(options, route, environ, now=time.monotonic(), spent=spent, interface_address=addresses)


def find_route(host: str, *, deadline: float, say_wait: bool = True) -> Route:
    """:func:`route_to` ``host``, retrying while its name does not resolve, until ``deadline``.

    In Kubernetes a worker pod often starts before the master's Service name resolves (its pod is
    still being scheduled): waiting for it is normal, for as long as the join timeout allows.
    """
    told = False
    while True:
        try:
            return route_to(host)
        except UnresolvedHost as err:
            if not told and say_wait:  # one line, so a node that waits says what it waits for
                write_line(f"shoal: {host} does not resolve yet on this node; retrying until the join timeout")
                told = True
            if time.monotonic() + RESOLVE_RETRY_S > deadline:
                raise UnresolvedHost(
                    f"{host} did not resolve on this node ({socket.gethostname()}) before the join timeout: "
                    f"{err.message}",
                    "in Kubernetes the master's Service name resolves once the master pod runs: check "
                    "`kubectl get pods,svc` and that the name is <job>-master-0 in the job's namespace; "
                    "elsewhere check /etc/hosts and DNS, or give an IP address",
                ) from None
            time.sleep(RESOLVE_RETRY_S)


__all__ = ["RendezvousPlan", "find_route", "plan_for"]
