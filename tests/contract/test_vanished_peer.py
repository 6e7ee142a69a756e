"""Issue 19: a node whose peer vanished took minutes to stop after SIGTERM; now it stops at once.

The cause, reproduced here with two namespace nodes: node A (rank 0, the store's host) disappears
without closing its connections (its link goes down, then its launcher dies), while node B's worker
waits for A's in init_process_group. B's agent polls the store (``num_nodes_waiting``); that
request blocked in C++ until TCP gave up (still waiting 400 s after SIGTERM, measured before the
fix), and a main thread blocked in C++ runs no signal handler. Store requests are now waited for
from Python with a bound (shoal.launch.rendezvous.stores.answer_within).
"""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from procs import wait_for
from shoal.launch.ports import find_free_port
from shoal.launch.rendezvous.stores import StoreSilent, answer_within

pytestmark = pytest.mark.multiprocess

PEER_SCRIPT = """
import os, time
import torch.distributed as dist
if os.environ["GROUP_RANK"] == "0":
    time.sleep(1000)  # node A's worker never joins
dist.init_process_group("gloo")  # node B's worker waits for A's here
"""


def test_a_silent_store_is_given_up_on_in_time_and_signals_still_work():
    """A real TCPStore whose server process is stopped (it never answers): ``check`` alone would wait
    for good; under answer_within it ends at the bound, and a signal interrupts the wait at once."""
    import torch.distributed as dist

    port = find_free_port()
    code = (
        "import datetime, time, torch.distributed as d; "
        f"s = d.TCPStore('127.0.0.1', {port}, None, True, datetime.timedelta(seconds=60)); "
        "print('up', flush=True); time.sleep(120)"
    )
    server = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "up"
        client = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=60))
        assert answer_within(lambda: client.check(["k"]), 10) is False
        os.kill(server.pid, signal.SIGSTOP)
        while "T (stopped)" not in Path(f"/proc/{server.pid}/status").read_text():
            time.sleep(0.05)
        started = time.monotonic()
        with pytest.raises(StoreSilent, match="no answer in 1 s"):
            answer_within(lambda: client.check(["k"]), 1)
        assert time.monotonic() - started < 5

        class Stop(Exception):
            pass

        def stop(_signum, _frame):
            raise Stop

        previous = signal.signal(signal.SIGUSR1, stop)
        timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGUSR1))
        try:
            started = time.monotonic()
            timer.start()
            with pytest.raises(Stop):
                answer_within(lambda: client.check(["k"]), 60)
            assert time.monotonic() - started < 5  # the handler ran while the request hung
        finally:
            timer.cancel()
            signal.signal(signal.SIGUSR1, previous)
        with pytest.raises(ZeroDivisionError):  # the call's own errors come through
            answer_within(lambda: 1 / 0, 5)
    finally:
        server.kill()
        server.wait()
        # The helpers left waiting on the stopped server end with its connection's reset, and the
        # client's goodbye to it fails: both print torch's warnings, here (this test's output) rather
        # than as stray lines in the run's output when the worker process ends.
        helpers = [t for t in threading.enumerate() if t.name == "shoal-store-request"]
        for helper in helpers:
            helper.join(10)
        client = None
        gc.collect()  # the exceptions' tracebacks hold it in cycles
    assert not [t for t in helpers if t.is_alive()], "a store request still waits after its server was killed"


@pytest.fixture
def nodes():
    from cluster.netns import netns_unavailable, node_pair

    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    with node_pair(tag=f"v{os.getpid() % 100000}", subnet=219) as pair:
        yield pair


def test_sigterm_stops_a_node_whose_store_host_vanished(nodes, tmp_path):
    from cluster.helpers import clean_env, shoal_on

    a, b = nodes
    script = tmp_path / "peer.py"
    script.write_text(PEER_SCRIPT)
    common = ["run", "--nnodes", "2", "--nproc", "1", "--master-addr", a.addr, "--master-port", "29741"]
    env = clean_env(SHOAL_INIT_TIMEOUT="900")
    node_a = shoal_on(a, [*common, "--node-rank", "0", str(script)], tmp_path / "a.log", env=env)
    node_b = shoal_on(b, [*common, "--node-rank", "1", str(script)], tmp_path / "b.log", env=env)
    wait_for(
        lambda: "starting rank 1 of 2" in node_b.output, 120, 0.2, "node B starting its rank",
        unless=lambda: node_b.proc.poll() is not None, details=lambda: node_b.output,
    )  # fmt: skip
    # B's worker is in init_process_group: connected to the workers' store on A.
    wait_for(
        lambda: _worker_connected(b, a.addr), 120, 0.2, "node B's worker connected to A's store",
        unless=lambda: node_b.proc.poll() is not None, details=lambda: node_b.output,
    )  # fmt: skip
    subprocess.run(["ip", "-n", a.name, "link", "set", a.ifname, "down"], check=True)  # no FIN, no RST
    node_a.proc.kill()
    node_a.proc.wait()
    time.sleep(2)  # a duration on purpose: B's agent's next calls to A's store go unanswered meanwhile
    started = time.monotonic()
    node_b.proc.terminate()
    node_b.wait(timeout=120)
    took = time.monotonic() - started
    assert node_b.returncode == 128 + signal.SIGTERM, node_b.output
    assert "stopped by SIGTERM" in node_b.output
    assert took < 15, f"node B took {took:.1f} s to stop after SIGTERM:\n{node_b.output}"
    left = b.pids()
    assert not left, f"processes left in node B: {left}"


def _worker_connected(node, address: str) -> bool:
    """Whether a process of ``node`` running the peer script holds a connection to ``address`` (any port)."""
    listed = node.run(["ss", "-Htnp", "state", "established", "dst", address], capture_output=True, text=True).stdout
    for pid in re.findall(r"pid=(\d+)", listed):
        try:
            if b"peer.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False
