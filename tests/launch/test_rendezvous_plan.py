"""The rendezvous planner: interface, addresses, store host and timeouts, as a pure function.

In-process checks on loopback (the planner is handed the route, the environment and the clock);
how a namespaced node finds its route is in tests/cluster/test_routing_netns.py.
"""

from __future__ import annotations

import dataclasses

import pytest

from shoal.env.network import route_to
from shoal.errors import ShoalError
from shoal.launch.options import LaunchOptions, parse_conf
from shoal.launch.rendezvous import plan_for
from shoal.launch.rendezvous.explain import explain_failure
from shoal.launch.rendezvous.handlers import JoinFailed, NodeLeft
from shoal.launch.rendezvous.plan import EXIT_MARGIN_S, plan_rendezvous, single_node_plan

LOOPBACK = route_to("127.0.0.1")


def _plan(environ=None, *, spent=0.0, **kw):
    return plan_rendezvous(LaunchOptions(**kw), LOOPBACK, {} if environ is None else environ, now=100.0, spent=spent)


def test_route_to_loopback():
    assert LOOPBACK.loopback and LOOPBACK.master_is_local
    assert LOOPBACK.addr == "127.0.0.1" and LOOPBACK.ifname == "lo"
    assert "every node runs on this machine" in LOOPBACK.why


def test_static_plan_on_loopback():
    plan = _plan(nnodes="2", node_rank=1, master_addr="127.0.0.1", master_port=29555, join_timeout=30)
    assert (plan.host, plan.port, plan.endpoint) == ("127.0.0.1", 29555, "127.0.0.1:29555")
    assert plan.launch_backend == "shoal-static" and not plan.hosts_store and plan.is_host is None
    assert plan.rdzv_configs["rank"] == 1
    assert plan.rdzv_configs["timeout"] == 30 - EXIT_MARGIN_S  # time left to report the failure in time
    assert plan.rdzv_configs["shoal_deadline"] == 100.0 + plan.rdzv_configs["timeout"]
    assert plan.bind_addr == "127.0.0.1"
    assert dict(plan.environ) == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo", "SHOAL_INIT_TIMEOUT": "30"}
    lines = plan.lines("shoal run", 2)
    assert lines[0] == (
        "shoal run: 2 workers on this node (node 1 of 2), waiting for the static "
        "rendezvous at 127.0.0.1:29555 (join timeout 30 s)"
    )
    assert lines[1].startswith(
        "shoal run: network: advertising 127.0.0.1 on lo (the master 127.0.0.1 "
        "is a loopback address: every node runs on this machine); GLOO_SOCKET_IFNAME=lo"
    )
    assert lines[1].endswith("listening on 127.0.0.1 only")


def test_the_users_settings_win():
    plan = _plan(
        {"GLOO_SOCKET_IFNAME": "eth7", "SHOAL_INIT_TIMEOUT": "5"},
        nnodes="2",
        master_addr="127.0.0.1",
        local_addr="10.0.0.5",
        rdzv_conf=(("timeout", "99"),),
    )
    assert dict(plan.environ) == {"NCCL_SOCKET_IFNAME": "lo"}
    assert plan.local_addr == "10.0.0.5" and plan.rdzv_configs["timeout"] == 99
    assert plan.bind_addr == "10.0.0.5"  # listen where the user said this node is reached
    assert "GLOO_SOCKET_IFNAME=eth7 (yours)" in plan.network_line("shoal")
    assert plan.hosts_store  # node rank 0 of a static rendezvous


def test_c10d_plan():
    plan = _plan(nnodes="1:3", rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:29411", join_timeout=12)
    assert plan.launch_backend == "shoal-c10d" and (plan.min_nodes, plan.max_nodes) == (1, 3)
    assert plan.is_host is None  # loopback: every node is here, the first to bind the port hosts it
    assert plan.rdzv_configs["join_timeout"] == 10 and plan.rdzv_configs["read_timeout"] == 10
    assert plan.rdzv_configs["last_call_timeout"] == 5
    told = _plan(nnodes="2", rdzv_backend="c10d", rdzv_endpoint="127.0.0.1", rdzv_conf=(("is_host", "yes"),))
    assert told.is_host and told.hosts_store and told.port == 29400
    assert "this node hosts the c10d store" in told.network_line("shoal")
    from_master = _plan(nnodes="2", rdzv_backend="c10d", master_addr="127.0.0.1", master_port=29001)
    assert from_master.endpoint == "127.0.0.1:29001"


def test_the_budget_counts_what_was_spent():
    fresh = _plan(nnodes="2", master_addr="127.0.0.1", join_timeout=20)
    late = _plan(nnodes="2", master_addr="127.0.0.1", join_timeout=20, spent=4.5)
    assert fresh.rdzv_configs["timeout"] - late.rdzv_configs["timeout"] == 5  # 4.5 s, whole seconds down
    assert late.rdzv_configs["timeout"] >= 1


def test_single_node_listens_on_loopback_on_a_port_the_os_picks():
    plan = single_node_plan(LaunchOptions(nproc=2), {})
    assert plan.single_node and (plan.host, plan.port, plan.bind_addr) == ("127.0.0.1", 0, "127.0.0.1")
    assert plan.is_host and plan.hosts_store and plan.launch_backend == "shoal-c10d"
    assert dict(plan.environ) == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    assert plan_for(LaunchOptions(nproc=4)) == dataclasses.replace(plan, environ=plan_for(LaunchOptions()).environ)
    mine = single_node_plan(LaunchOptions(), {"GLOO_SOCKET_IFNAME": "eth0"})
    assert dict(mine.environ) == {"NCCL_SOCKET_IFNAME": "lo"} and dict(mine.user_ifnames) == {
        "GLOO_SOCKET_IFNAME": "eth0"
    }


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"nnodes": "2", "node_rank": 2}, "--node-rank 2 is not in 0..1"),
        ({"nnodes": "1:2"}, "--nnodes 1:2 is elastic, which the static rendezvous cannot do"),
        ({"nnodes": "two"}, "--nnodes two is not N or MIN:MAX"),
        ({"nnodes": "3:2"}, "--nnodes 3:2 is not a valid node count"),
        ({"nnodes": "2", "join_timeout": 0}, "--join-timeout must be positive"),
        ({"nproc": 0}, "--nproc must be at least 1"),
        ({"master_port": 70000}, "is not a TCP port"),
    ],
)
def test_impossible_options(kw, message):
    with pytest.raises(ShoalError, match=message) as info:
        LaunchOptions(**{"master_addr": "127.0.0.1", **kw})
    assert info.value.hint


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"nnodes": "2", "rdzv_backend": "c10d", "master_addr": None}, "--rdzv-backend c10d needs --rdzv-endpoint"),
        ({"nnodes": "2", "rdzv_backend": "c10d", "rdzv_endpoint": "127.0.0.1:99999"}, "bad rendezvous endpoint"),
        ({"nnodes": "2", "rdzv_backend": "c10d", "rdzv_endpoint": "[::1"}, "bad rendezvous endpoint"),
        (
            {"nnodes": "2", "rdzv_backend": "c10d", "rdzv_endpoint": "h", "rdzv_conf": (("is_host", "maybe"),)},
            "boolean",
        ),
    ],
)
def test_plans_that_cannot_work(kw, message):
    with pytest.raises(ShoalError, match=message) as info:
        _plan(**{"master_addr": "127.0.0.1", **kw})
    assert info.value.hint


def test_options_and_their_one_set_of_checks():
    assert not LaunchOptions().several_nodes and not LaunchOptions().asks_for_workers
    assert LaunchOptions(nproc=2).asks_for_workers and not LaunchOptions(nproc=2).several_nodes
    opts = LaunchOptions(nnodes="2", master_addr="10.0.0.1")
    assert opts.node_counts == (2, 2) and opts.several_nodes and opts.rdzv_id == "shoal"
    assert parse_conf("is_host=1, read_timeout=5") == (("is_host", "1"), ("read_timeout", "5"))
    with pytest.raises(ShoalError, match="is not KEY=VALUE"):
        parse_conf("is_host")


def test_failures_name_the_endpoint_the_arrivals_and_a_hint():
    host = _plan(nnodes="3", master_addr="127.0.0.1", master_port=29555, join_timeout=9)
    err = RuntimeError("Timed out after 8 seconds waiting for clients. 2/3 clients joined.")
    text = explain_failure(err, host).format()
    assert text.splitlines()[0] == (
        "shoal: error: only 2 of 3 nodes arrived at the static rendezvous at 127.0.0.1:29555 within 9 s"
    )
    assert text.splitlines()[1].startswith("HINT: start the missing node(s) with the same --nnodes")

    c10d = _plan(nnodes="2:4", rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:29400")
    text = explain_failure(JoinFailed(TimeoutError(), 1, 4), c10d).format()
    assert "only 1 of 2 nodes arrived at the c10d rendezvous at 127.0.0.1:29400 within 60 s" in text

    from shoal.launch.ports import find_free_port

    port = find_free_port()
    client = _plan(nnodes="2", node_rank=1, master_addr="127.0.0.1", master_port=port)
    err = RuntimeError("The client socket has timed out after 10000ms while trying to connect")
    error = explain_failure(err, client)
    assert error.exit_code == 1
    assert error.message == (
        f"could not join the static rendezvous at 127.0.0.1:{port} within 60 s: nothing listens on port {port} of 127.0.0.1"
    )
    assert error.hint.startswith("start node rank 0 (it hosts the store)")

    left = explain_failure(NodeLeft("another node ended the job"), client).format()
    assert left.startswith("shoal: error: another node ended the job; this node's workers were stopped")


def test_c10d_heartbeats_by_number_of_nodes():
    """Up to 8 nodes a heartbeat every 2 s; above, every 5 s (each rewrites the whole rendezvous
    state, and while nodes join one whose heartbeat is 3 intervals old is dropped: 16 nodes short of
    CPU did not close with 2 s), said in one start-up line; the user's own interval wins, and static
    has none."""
    few = _plan(nnodes="8", rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:29400")
    assert few.rdzv_configs["keep_alive_interval"] == 2 and few.scale_note is None
    assert len(few.lines("shoal run", 1)) == 2
    sixteen = _plan(nnodes="15:16", rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:29400")
    assert sixteen.rdzv_configs["keep_alive_interval"] == 5 and sixteen.rdzv_configs["keep_alive_max_attempt"] == 3
    assert sixteen.scale_note.startswith("16 nodes: c10d heartbeats every 5 s, not 2 s")
    many = _plan(nnodes="32:1000", rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:29400")
    assert many.rdzv_configs["keep_alive_interval"] == 5 and many.rdzv_configs["keep_alive_max_attempt"] == 3
    lines = many.lines("shoal run", 8)
    assert lines[2] == (
        "shoal run: 1000 nodes: c10d heartbeats every 5 s, not 2 s (each one rewrites the whole rendezvous "
        "state in the store), so a lost node is noticed after 15 s; at this size the static rendezvous "
        "costs the store far less (docs/MULTINODE.md)"
    )
    yours = _plan(
        nnodes="1000",
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:29400",
        rdzv_conf=parse_conf("keep_alive_interval=3"),
    )
    assert yours.rdzv_configs["keep_alive_interval"] == 3 and yours.scale_note is None
    static = _plan(nnodes="1000", node_rank=3, master_addr="127.0.0.1", master_port=29555)
    assert "keep_alive_interval" not in static.rdzv_configs and static.scale_note is None
