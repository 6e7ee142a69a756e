"""The simulated replica groups of :mod:`benchmarks.lighthouse_scale`: one process's share of them.

Each simulated group is what torchft's ``Manager`` runs on a real group's rank 0, minus the model
and the collectives: torchft's own Rust ``ManagerServer`` (it connects to the lighthouse, heartbeats
it every ``heartbeat_interval`` on its own task, and forwards the group's quorum request with its
replica id, address, store address and step) and torchft's ``ManagerClient``, through which the
group's training loop asks for a quorum each step (``_quorum``, as ``Manager._async_quorum`` does)
and votes its commit (``should_commit``, answered by the group's own manager server). Between two
quorums the group "trains" by sleeping ``step_s``.

Both classes come from torchft's extension module loaded alone, as shoal's lighthouse entry point
does: importing the ``torchft`` package would import torch (seconds and ~650 MB per process).
Every group's Python thread spends its time blocked in Rust with the GIL released, so a few
processes hold a thousand groups. Module-level functions only: the processes are spawned.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

TOKIO_THREADS = "1"
"""Tokio worker threads per runtime in these processes (each ManagerServer and ManagerClient builds
its own runtime; torchft's default is min(4, cores)): a thousand groups on a few cores."""


def torchft_core() -> Any:
    """torchft's extension module (``torchft._torchft``), loaded without the package (no torch)."""
    package = importlib.util.find_spec("torchft")
    if package is None or not package.submodule_search_locations:
        raise RuntimeError("torchft is not installed (pip install 'shoal[ft]')")
    found = glob.glob(os.path.join(package.submodule_search_locations[0], "_torchft*.so"))
    if not found:
        raise RuntimeError("torchft's extension module is missing")
    spec = importlib.util.spec_from_file_location("torchft._torchft", found[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_groups(conn: Any, spec: dict[str, Any]) -> None:
    """One process's groups: create them, say ``ready``, wait for ``go``, run every step, send the records.

    ``spec``: ``groups`` (their ids), ``lighthouse`` (URL), ``heartbeat_ms``, ``steps``, ``step_s``,
    ``quorum_timeout_s``, ``connect_timeout_s``, ``quorum_retries``, ``victim`` (a group id or None)
    and ``die_at`` (the step at which the victim dies instead of asking for its quorum).
    """
    os.environ["RUST_LOG"] = os.environ.get("RUST_LOG", "warn")  # torchft logs every quorum at info
    os.environ["TOKIO_WORKER_THREADS"] = TOKIO_THREADS
    ft = torchft_core()
    connect = timedelta(seconds=spec["connect_timeout_s"])
    servers: dict[int, Any] = {}
    clients: dict[int, Any] = {}
    errors: list[str] = []
    try:
        for group in spec["groups"]:
            try:
                servers[group] = ft.ManagerServer(
                    replica_id=f"sim_group_{group}:{uuid.uuid4()}",  # torchft.Manager's form: name:uuid
                    lighthouse_addr=spec["lighthouse"],
                    hostname="127.0.0.1",
                    bind="127.0.0.1:0",
                    store_addr=f"127.0.0.1:{29500 + group % 1000}",  # never dialled by the lighthouse
                    world_size=1,
                    heartbeat_interval=timedelta(milliseconds=spec["heartbeat_ms"]),
                    connect_timeout=connect,
                    quorum_retries=spec["quorum_retries"],
                )
                clients[group] = ft.ManagerClient(servers[group].address(), connect_timeout=connect)
            except Exception as err:
                errors.append(f"group {group}: {str(err).splitlines()[0] if str(err) else type(err).__name__}")
                break
        conn.send(("ready", len(servers), errors))
        if errors:
            return
        message = conn.recv()  # ("go",) or ("stop",)
        if message[0] != "go":
            return
        records: list[tuple] = []
        deaths: list[tuple[int, float]] = []
        lock = threading.Lock()
        threads = [
            threading.Thread(
                target=_group_loop,
                args=(group, servers[group], clients[group], spec, records, deaths, lock),
                name=f"sim-group-{group}",
                daemon=True,
            )
            for group in spec["groups"]
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        conn.send(("done", records, deaths))
    finally:
        for server in servers.values():
            server.shutdown()


def _group_loop(group, server, client, spec, records, deaths, lock) -> None:
    timeout = timedelta(seconds=spec["quorum_timeout_s"])
    for step in range(spec["steps"]):
        if group == spec["victim"] and step == spec["die_at"]:
            # Dies where it would ask for this step's quorum: its manager (and so its heartbeats) stops.
            with lock:
                deaths.append((group, time.monotonic()))
            server.shutdown()
            return
        asked = time.monotonic()
        try:
            result = client._quorum(
                group_rank=0,
                step=step,
                checkpoint_metadata="",
                shrink_only=False,
                init_sync=True,
                commit_failures=0,
                timeout=timeout,
            )
        except Exception as err:
            with lock:
                records.append((group, step, asked, time.monotonic(), -1, 0, str(err).splitlines()[0][:200]))
            return
        answered = time.monotonic()
        client.should_commit(0, step, True, timeout=timeout)
        with lock:
            records.append((group, step, asked, answered, result.quorum_id, result.replica_world_size, ""))
        time.sleep(spec["step_s"])
