"""Nothing listens where it need not (issue 15): every listening socket of a single-node job is on
loopback (across nodes: tests/cluster/test_multinode_listening.py).

Real jobs, real sockets: while the workers hold (tests/launch/scripts/hold.py), every listening TCP
socket owned by the launcher and its descendants is read from /proc (tests/listening.py).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import warm
from conftest import shoal_cmd
from listening import descendants, is_loopback, listening
from procs import wait_for

pytestmark = pytest.mark.multiprocess

HOLD = str(Path(__file__).parent / "scripts" / "hold.py")


def _sockets_while_ready(proc: subprocess.Popen, out: Path, ranks: int, pids_of=None) -> set:
    """Wait until every rank is ready, take the job's listening sockets, then let the job end."""
    wait_for(lambda: len(list(out.glob("ready-*"))) == ranks or proc.poll() is not None, timeout=180)
    assert proc.poll() is None, proc.communicate()
    # Each rank wrote its ready file after its all-reduce: its gloo listener is up.
    found = listening(pids_of() if pids_of else descendants(proc.pid))
    (out / "done").write_text("")
    return found


def test_shoal_run_on_one_node_listens_on_loopback_only(tmp_path):
    proc = warm.popen(shoal_cmd("run", "--nproc", "2", HOLD, str(tmp_path)), stderr=subprocess.PIPE, text=True)
    try:
        found = _sockets_while_ready(proc, tmp_path, 2)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    pids = {pid for _, _, pid in found}
    assert len(pids) >= 3, found  # the launcher's stores and each worker's gloo listener
    assert all(is_loopback(address) for address, _, _ in found), found
    assert "listening on 127.0.0.1 only" in err


def test_shoal_train_on_one_node_listens_on_loopback_only(tmp_path):
    out = tmp_path / "run"
    cmd = shoal_cmd("train", "digits", "--nproc", "2", "--epochs", "200", "--device", "cpu", "--out", str(out))
    proc = warm.popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (out / "metrics.jsonl").exists() or proc.poll() is not None, timeout=180)
        assert proc.poll() is None
        found = listening(descendants(proc.pid))
    finally:
        proc.kill()
        proc.wait()
    assert len({pid for _, _, pid in found}) >= 3, found
    assert all(is_loopback(address) for address, _, _ in found), found
