"""TF_CONFIG for MultiWorkerMirroredStrategy (shoal.launch.tf_config): the exchange over a real store,
bad input refused in one line, and a real 2-worker Keras ``fit`` under ``shoal run --tf-config``.

The other paths (mpirun's shim, srun, operator pods) are in test_tf_config_paths.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from shoal.errors import ShoalError
from shoal.launch.options import LaunchOptions
from shoal.launch.tf_config import add_tf_config, check_layout, exchange, requested, reserve_port, tf_config

SCRIPTS = Path(__file__).parent / "scripts"


def test_tf_config_is_the_json_tensorflow_reads():
    assert json.loads(tf_config(["10.0.0.1:20001", "10.0.0.2:20002"], 1)) == {
        "cluster": {"worker": ["10.0.0.1:20001", "10.0.0.2:20002"]},
        "task": {"type": "worker", "index": 1},
    }


def test_opt_in_values_and_a_bad_one():
    assert not requested({})
    assert not requested({"SHOAL_TF_CONFIG": "0"})
    assert requested({"SHOAL_TF_CONFIG": "yes"})
    with pytest.raises(ShoalError, match="neither on nor off") as err:
        requested({"SHOAL_TF_CONFIG": "maybe"})
    assert "SHOAL_TF_CONFIG=1" in err.value.hint


def test_without_the_opt_in_nothing_changes():
    env = {"RANK": "0", "SHOAL_TF_CONFIG": "0"}
    add_tf_config(env, serve=True)
    assert env == {"RANK": "0"}


@pytest.mark.parametrize(
    "options, environ, message",
    [
        (LaunchOptions(), {"TF_CONFIG": "{}"}, "TF_CONFIG is already set"),
        (LaunchOptions(), {"SHOAL_TF_CONFIG": "0"}, "says not to"),
        (
            LaunchOptions(nnodes="1:2", rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:29400"),
            {},
            "nodes cannot come and go",
        ),
    ],
    ids=["tf-config-already-set", "opt-out-contradicts", "elastic-nodes"],
)
def test_layouts_tf_cannot_be_told_about_are_refused(options, environ, message):
    with pytest.raises(ShoalError, match=message) as err:
        check_layout(options, environ)
    assert err.value.hint


def test_reserved_ports_lie_below_the_ephemeral_range():
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    socks = [reserve_port("127.0.0.1") for _ in range(4)]
    try:
        ports = [s.getsockname()[1] for s in socks]
        assert len(set(ports)) == 4 and all(port < low for port in ports)
    finally:
        for s in socks:
            s.close()


def test_exchange_over_a_real_store_gives_every_rank_the_same_list_in_rank_order():
    """Three ranks meet through a real TCPStore (loopback), each holding the port it publishes."""
    from shoal.launch.rendezvous.stores import connect_store, serve_store

    server = serve_store("127.0.0.1", 0, timeout=30)
    held = [reserve_port("127.0.0.1") for _ in range(3)]
    mine = [f"127.0.0.1:{s.getsockname()[1]}" for s in held]
    got: dict[int, list[str]] = {}

    def rank(r: int) -> None:
        store = server if r == 0 else connect_store("127.0.0.1", server.port, timeout=30)
        got[r] = exchange(store, "t/0", r, 3, mine[r], timeout=30)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (2, 0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for s in held:
        s.close()
    assert got == {0: mine, 1: mine, 2: mine}
    assert server.get("t/0/done") == b"1"  # what a serving rank 0 waits for before its store goes


def test_a_rank_that_never_publishes_is_named_after_the_timeout():
    from shoal.launch.rendezvous.stores import serve_store

    server = serve_store("127.0.0.1", 0, timeout=10)
    with pytest.raises(ShoalError, match=r"waited 1 s for the addresses of ranks 1 of 2") as err:
        exchange(server, "t/0", 0, 2, "127.0.0.1:20000", timeout=1)
    assert "SHOAL_INIT_TIMEOUT" in err.value.hint


def test_shoal_run_refuses_tf_config_with_elastic_nodes_in_one_line(shoal, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    proc = shoal(
        "run", "--tf-config", "--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29400",
        str(script),
    )  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("shoal: error: --tf-config with --nnodes 1:2") and lines[1].startswith("HINT: ")
    assert len(lines) == 2, proc.stderr


def test_the_per_rank_shim_refuses_a_tf_config_it_would_replace_in_one_line():
    """An mpirun rank (Open MPI's variables) through ``python -m shoal.launch.as_torchrun``: no torch."""
    env = {
        "PATH": os.environ["PATH"],
        "OMPI_COMM_WORLD_RANK": "0",
        "OMPI_COMM_WORLD_SIZE": "1",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
        "SHOAL_TF_CONFIG": "1",
        "TF_CONFIG": "{}",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "shoal.launch.as_torchrun", "--", "true"], env=env, capture_output=True, text=True
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 2, proc.stderr
    assert "TF_CONFIG is already set" in lines[0] and lines[1].startswith("HINT: unset TF_CONFIG")


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="tensorflow is not installed")
def test_keras_fit_under_multiworker_mirrored_strategy_with_shoal_run_tf_config(shoal, tmp_path):
    """Two TF workers, one Keras fit: the strategy sees 2 workers (shoal's TF_CONFIG), and both end
    with the same weights and losses."""
    proc = shoal(
        "run", "--nproc", "2", "--tf-config", str(SCRIPTS / "tf_mwms_fit.py"), str(tmp_path),
        env={"TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    workers = [json.loads((tmp_path / f"worker{i}.json").read_text()) for i in (0, 1)]
    assert [w["index"] for w in workers] == [0, 1]
    assert {w["replicas"] for w in workers} == {2}
    addresses = workers[0]["workers"]
    assert workers[1]["workers"] == addresses and len(set(addresses)) == 2
    assert all(a.startswith("127.0.0.1:") for a in addresses)  # one node: loopback, as the rest of the job
    assert workers[0]["weights"] == workers[1]["weights"]
    assert workers[0]["loss"] == workers[1]["loss"] and workers[0]["loss"][-1] < workers[0]["loss"][0]
