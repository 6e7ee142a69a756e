"""How shoal picks interface, address, store host and timeouts, and words rendezvous failures.

In-process checks on loopback, plus one look from inside a namespaced node (whose hostname
resolves to 127.0.0.1 and whose only way out is a veth) at what :func:`route_to` picks there.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time

import pytest

from shoal.errors import ShoalError
from shoal.launch import network, rendezvous
from shoal.launch.rendezvous import (
    JoinFailed,
    NodeLeft,
    RendezvousOptions,
    explain_failure,
    options_from_args,
    parse_conf,
    plan_rendezvous,
)


def _plan(environ=None, **kw):
    return plan_rendezvous(RendezvousOptions(**kw), environ={} if environ is None else environ)


def test_route_to_loopback():
    route = network.route_to("127.0.0.1")
    assert route.loopback and route.master_is_local
    assert route.addr == "127.0.0.1" and route.ifname == "lo"
    assert "every node runs on this machine" in route.why


def test_static_plan_on_loopback():
    plan = _plan(nnodes="2", node_rank=1, master_addr="127.0.0.1", master_port=29555, join_timeout=30)
    assert (plan.host, plan.port, plan.endpoint) == ("127.0.0.1", 29555, "127.0.0.1:29555")
    assert plan.launch_backend == "shoal-static" and not plan.hosts_store and plan.is_host is None
    assert plan.rdzv_configs["rank"] == 1
    assert plan.rdzv_configs["timeout"] == 28  # 30 s, less 2 s to report the failure in time
    assert plan.environ == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo", "SHOAL_INIT_TIMEOUT": "30"}
    lines = plan.lines("shoal run", 2)
    assert lines[0] == (
        "shoal run: 2 workers on this node (node 1 of 2), waiting for the static "
        "rendezvous at 127.0.0.1:29555 (join timeout 30 s)"
    )
    assert lines[1].startswith(
        "shoal run: network: advertising 127.0.0.1 on lo (the master 127.0.0.1 "
        "is a loopback address: every node runs on this machine); GLOO_SOCKET_IFNAME=lo"
    )


def test_the_users_settings_win():
    plan = _plan(
        {"GLOO_SOCKET_IFNAME": "eth7", "SHOAL_INIT_TIMEOUT": "5"},
        nnodes="2",
        master_addr="127.0.0.1",
        local_addr="10.0.0.5",
        conf={"timeout": "99"},
    )
    assert plan.environ == {"NCCL_SOCKET_IFNAME": "lo"}
    assert plan.local_addr == "10.0.0.5" and plan.rdzv_configs["timeout"] == 99
    assert "GLOO_SOCKET_IFNAME=eth7 (yours)" in plan.network_line("shoal")
    assert plan.hosts_store  # node rank 0 of a static rendezvous


def test_c10d_plan():
    plan = _plan(nnodes="1:3", backend="c10d", endpoint="127.0.0.1:29411", join_timeout=12)
    assert plan.launch_backend == "shoal-c10d" and (plan.min_nodes, plan.max_nodes) == (1, 3)
    assert plan.is_host is None  # loopback: every node is here, torch lets the first one host
    assert plan.rdzv_configs["join_timeout"] == 10 and plan.rdzv_configs["read_timeout"] == 10
    assert plan.rdzv_configs["last_call_timeout"] == 5
    told = _plan(nnodes="2", backend="c10d", endpoint="127.0.0.1", conf={"is_host": "1"})
    assert told.is_host and told.hosts_store and told.port == 29400
    assert "this node hosts the c10d store" in told.network_line("shoal")
    from_master = _plan(nnodes="2", backend="c10d", master_addr="127.0.0.1", master_port=29001)
    assert from_master.endpoint == "127.0.0.1:29001"


def test_the_budget_counts_from_the_start():
    plan = plan_rendezvous(
        RendezvousOptions(nnodes="2", master_addr="127.0.0.1", join_timeout=20),
        environ={},
        started=time.monotonic() - 4.5,
    )
    assert plan.rdzv_configs["timeout"] == 13  # 20 - 5 s spent - 2 s to report
    assert 0 <= time.monotonic() - rendezvous.process_started() < 3600


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"nnodes": "2", "node_rank": 2}, "--node-rank 2 is not in 0..1"),
        ({"nnodes": "1:2"}, "--nnodes 1:2 is elastic, which the static rendezvous cannot do"),
        (
            {"nnodes": "2", "backend": "c10d", "master_addr": None},
            "--rdzv-backend c10d needs --rdzv-endpoint HOST:PORT",
        ),
        ({"nnodes": "two"}, "--nnodes two is not N or MIN:MAX"),
        ({"nnodes": "3:2"}, "--nnodes 3:2 is not a valid node count"),
        ({"nnodes": "2", "backend": "c10d", "endpoint": "127.0.0.1:99999"}, "bad rendezvous endpoint"),
    ],
)
def test_impossible_options(kw, message):
    with pytest.raises(ShoalError, match=message) as info:
        _plan(**{"master_addr": "127.0.0.1", **kw})
    assert info.value.hint


def test_options_from_flags():
    parser = argparse.ArgumentParser()
    rendezvous.add_rendezvous_arguments(parser, max_restarts=True)
    assert options_from_args(parser.parse_args([])) is None  # one node: nothing to plan
    opts = options_from_args(parser.parse_args(["--nnodes", "2", "--master-addr", "10.0.0.1"]))
    assert opts.min_max_nodes == (2, 2) and opts.master_addr == "10.0.0.1" and opts.run_id == "shoal"
    with pytest.raises(ShoalError, match="--join-timeout must be positive"):
        options_from_args(parser.parse_args(["--nnodes", "2", "--join-timeout", "0"]))
    assert parse_conf("is_host=1, read_timeout=5") == {"is_host": "1", "read_timeout": "5"}
    with pytest.raises(ShoalError, match="is not KEY=VALUE"):
        parse_conf("is_host")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_failures_name_the_endpoint_the_arrivals_and_a_hint():
    host = _plan(nnodes="3", master_addr="127.0.0.1", master_port=29555, join_timeout=9)
    err = RuntimeError("Timed out after 8 seconds waiting for clients. 2/3 clients joined.")
    text = explain_failure(err, host).format()
    assert text.splitlines()[0] == (
        "shoal: error: only 2 of 3 nodes arrived at the static rendezvous at 127.0.0.1:29555 within 9 s"
    )
    assert text.splitlines()[1].startswith("HINT: start the missing node(s) with the same --nnodes")

    c10d = _plan(nnodes="2:4", backend="c10d", endpoint="127.0.0.1:29400")
    text = explain_failure(JoinFailed(TimeoutError(), 1, 4), c10d).format()
    assert "only 1 of 2 nodes arrived at the c10d rendezvous at 127.0.0.1:29400 within 60 s" in text

    port = _free_port()
    client = _plan(nnodes="2", node_rank=1, master_addr="127.0.0.1", master_port=port)
    err = RuntimeError("The client socket has timed out after 10000ms while trying to connect")
    error = explain_failure(err, client)
    assert error.exit_code == 1
    assert error.message == (
        f"could not join the static rendezvous at 127.0.0.1:{port} within 60 s: "
        f"nothing listens on port {port} of 127.0.0.1"
    )
    assert error.hint.startswith("start node rank 0 (it hosts the store)")

    left = explain_failure(NodeLeft("another node ended the job"), client).format()
    assert left.startswith("shoal: error: another node ended the job; this node's workers were stopped")


@pytest.mark.multiprocess
def test_what_a_namespaced_node_picks(two_nodes):
    a, b = two_nodes
    probe = (
        "import json, socket, sys\n"
        "from shoal.launch import network\n"
        "out = {}\n"
        "for target in sys.argv[1:]:\n"
        "    try:\n"
        "        r = network.route_to(target)\n"
        "        out[target] = [r.addr, r.ifname, r.master_is_local, r.loopback, r.why]\n"
        "    except Exception as err:\n"
        "        out[target] = ['error', getattr(err, 'message', str(err))]\n"
        "out['hostname'] = socket.gethostname()\n"
        "print(json.dumps(out))\n"
    )
    hostname = socket.gethostname()
    proc = b.run(
        [sys.executable, "-c", probe, a.addr, b.addr, "10.77.0.9", "10.77.5.1", hostname, "no-such-host.invalid"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen[a.addr] == [b.addr, b.ifname, False, False, f"the interface that routes to the master {a.addr}"]
    assert seen[b.addr] == [b.addr, b.ifname, True, False, f"the master {b.addr} is this node's own address"]
    assert seen["10.77.0.9"][:3] == [b.addr, b.ifname, False]  # on the link, even if nobody is there
    assert seen["10.77.5.1"] == [
        "error",
        "no route from this node to the master 10.77.5.1 (10.77.5.1): Network is unreachable",
    ]
    # The hostname resolves to loopback here: this node's own name; the veth is its only way out.
    assert seen[hostname][:4] == [b.addr, b.ifname, True, False], seen
    assert seen["no-such-host.invalid"][0] == "error"
    assert "cannot resolve the master address 'no-such-host.invalid'" in seen["no-such-host.invalid"][1]
