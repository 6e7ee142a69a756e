"""The torch internals shoal's rendezvous handlers lean on, checked against the installed torch.

src/shoal/launch/rendezvous/handlers.py is the only module touching them. If torch changes one,
a test here fails with the name of what changed: update the handlers (and this file) for the new
torch before anything else. Read from torch 2.14 and 2.15 (torch/distributed/elastic/rendezvous/).
"""

from __future__ import annotations

import inspect
import os
import time

import pytest
import torch

from listening import listening
from procs import wait_for
from shoal.launch.rendezvous.handlers import SHARED_STORE_OPT_OUT, JoinFailed, arrived, register_backends
from shoal.launch.rendezvous.stores import connect_store, serve_store


def test_the_rendezvous_state_still_lists_participants_and_waiters():
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    state = dynamic_rendezvous._RendezvousState()
    assert hasattr(state, "participants") and hasattr(state, "wait_list"), (
        f"torch {torch.__version__}: _RendezvousState lost participants/wait_list (shoal counts arrivals with them)"
    )
    source = inspect.getsource(dynamic_rendezvous.DynamicRendezvousHandler)
    assert "self._this_node" in source, "DynamicRendezvousHandler no longer keeps _this_node"
    assert SHARED_STORE_OPT_OUT in inspect.getsource(dynamic_rendezvous), (
        f"torch {torch.__version__} no longer reads {SHARED_STORE_OPT_OUT}: its c10d handler would serve "
        "its own workers' store on every interface again"
    )


def test_a_store_can_be_handed_a_listening_socket():
    server = serve_store("127.0.0.1", 0, timeout=10)
    client = connect_store("127.0.0.1", server.port, timeout=10)
    client.set("k", "v")
    assert server.get("k") == b"v"


def _params(endpoint: str, **config):
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    return RendezvousParameters(
        backend="shoal-c10d", endpoint=endpoint, run_id=f"pin{os.getpid()}", min_nodes=2, max_nodes=2, **config
    )


def test_a_failed_join_still_counts_who_came(monkeypatch):
    """One node of two: the handler's join fails and the private state says one node was there."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    register_backends()
    monkeypatch.setenv(SHARED_STORE_OPT_OUT, "1")
    probe = serve_store("127.0.0.1", 0, timeout=5)  # only to learn a free port, then give it back
    port = probe.port
    del probe
    handler = rendezvous_handler_registry.create_handler(
        _params(f"127.0.0.1:{port}", is_host=True, join_timeout=3, last_call_timeout=1, shoal_bind_addr="127.0.0.1")
    )
    started = time.monotonic()
    with pytest.raises(JoinFailed) as info:
        handler.next_rendezvous()
    assert info.value.arrived == 1 and info.value.expected == 2, (
        f"torch {torch.__version__}: the rendezvous state could not be read (arrived={info.value.arrived})"
    )
    assert time.monotonic() - started < 60  # the join timeout was honoured (3 s), not torch's 600 s
    assert arrived(object(), object()) is None  # anything unreadable is "unknown", never an error


def test_the_workers_store_of_a_round_is_published_for_the_other_nodes(monkeypatch):
    """Two agents in this process (two threads) meet; both read the same workers' store address."""
    import threading

    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    register_backends()
    monkeypatch.setenv(SHARED_STORE_OPT_OUT, "1")
    probe = serve_store("127.0.0.1", 0, timeout=5)
    port = probe.port
    del probe
    infos, handlers = {}, []  # the handlers live as long as the agents would (they serve the store)

    def node(name, is_host):
        handler = rendezvous_handler_registry.create_handler(
            _params(f"127.0.0.1:{port}", is_host=is_host, join_timeout=30, last_call_timeout=1,
                    shoal_bind_addr="127.0.0.1", local_addr="127.0.0.1")
        )  # fmt: skip
        handlers.append(handler)
        infos[name] = handler.next_rendezvous()
        assert handler.use_agent_store

    host = threading.Thread(target=node, args=("a", True))
    host.start()
    # The host node's store is up (its listening socket is this process's) before the other joins.
    wait_for(lambda: any(p == port for _, p, _ in listening([os.getpid()])), timeout=30)
    node("b", False)
    host.join(timeout=60)
    a, b = infos["a"].bootstrap_store_info, infos["b"].bootstrap_store_info
    assert (a.master_addr, a.master_port) == (b.master_addr, b.master_port) and a.master_addr == "127.0.0.1"
    # The rank-0 node serves it, on 127.0.0.1 only, and a worker-style client can use it.
    store = connect_store(a.master_addr, a.master_port, timeout=10)
    store.set("x", "1")
    assert store.get("x") == b"1"
