"""Nodes that come and go (issue 14): an elastic ``shoal train`` (c10d, ``--nnodes 2:3``) on
namespace nodes loses a node and goes on without it, and takes in a node started later.

Three pods on one bridge (tests/cluster/pods.py), one worker each, a run directory every node sees
(the namespaces share the file system). Each test ends in a finished run whose every epoch saw
every training sample exactly once, whatever the world size was.

The two runs go at once, each on three pods of its own (:func:`runs`): each mostly waits on the
rendezvous at shoal's own settings (a lost node: its heartbeats and the last call, 10-12 s; a late
one: the first two nodes' last call, then its arrival, 8-11 s), so one waits while the other trains.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from background import Background
from cluster.helpers import clean_env
from cluster.pods import PodSpec, pod_network, pods_unavailable
from procs import wait_for

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(900)]

EPOCHS = 20
"""The joining node's run: long enough that the node, started after epoch 1 (its launcher, then the
rendezvous), always arrives while the two others still train. An epoch of digits takes 0.1-0.3 s, and
the arrival is seconds of rendezvous, not CPU: 10 epochs were too few once (a run with three test
files at a time, 2026-11-25: the two first nodes finished before the third arrived)."""
LOST_EPOCHS = 10
"""The lost node's run: killed after epoch 3 on 3 nodes, the others cannot finish any later step without a
new round, so 7 epochs on 2 nodes are as good a proof as 17 (and take half the time)."""
TRAIN_SAMPLES = 1440  # digits' training set


@contextmanager
def _three_nodes(tag: str) -> Iterator:
    names = ["e0", "e1", "e2"]
    with pod_network([PodSpec(name, resolves={n: n for n in names if n != name}) for name in names], tag=tag) as net:
        yield net


def _start(pod, out: Path, log: Path, endpoint: str, epochs: int = EPOCHS) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "shoal", "train", "digits", "--device", "cpu", "--epochs", str(epochs),
        "--nproc", "1", "--nnodes", "2:3", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
        "--max-restarts", "3", "--out", str(out), "--rdzv-id", "elastic",
    ]  # fmt: skip
    return pod.popen(cmd, env=clean_env(), stdout=open(log, "w"), stderr=subprocess.STDOUT)


def _epochs(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _wait(predicate, timeout: float, what: str, logs) -> None:
    wait_for(predicate, timeout, 0.2, what, details=lambda: "\n".join(p.read_text() for p in logs))


def _finished_exactly(out: Path, epochs: int = EPOCHS) -> list[dict]:
    records = _epochs(out)
    assert [r["epoch"] for r in records] == list(range(1, epochs + 1))
    assert {r["samples_seen"] for r in records} == {TRAIN_SAMPLES}  # every sample once, every epoch
    return records


def _lose_a_node(tmp_path: Path) -> None:
    with _three_nodes(tag="e0") as net:
        _lose_a_node_of(net, tmp_path)


def _lose_a_node_of(net, tmp_path: Path) -> None:
    out, endpoint = tmp_path / "run", f"{net['e0'].addr}:29631"
    logs = [tmp_path / f"{p.name}.log" for p in net]
    procs = [_start(pod, out, log, endpoint, LOST_EPOCHS) for pod, log in zip(net, logs)]
    _wait(lambda: len(_epochs(out)) >= 3 and _epochs(out)[-1]["world_size"] == 3, 240, "epoch 3 on 3 nodes", logs)
    lost = net["e2"]
    procs[2].send_signal(signal.SIGKILL)  # the node's launcher dies; its worker dies with it
    procs[2].wait()
    for proc in procs[:2]:
        assert proc.wait(timeout=600) == 0, "\n".join(p.read_text() for p in logs)
    records = _finished_exactly(out, LOST_EPOCHS)
    # The kill came after an epoch on 3 nodes (the wait above); the first epochs may have run on 2 when
    # the third node's launcher came after the last call (a loaded machine), and it joined later.
    assert 3 in {r["world_size"] for r in records} and records[-1]["world_size"] == 2, records
    for log in logs[:2]:
        text = log.read_text()
        assert f"node {lost.addr} left: the job goes on with 2 nodes (2 workers)" in text, text
        assert "Traceback" not in text and "Connection closed by peer" not in text, text
    assert "resuming from" in logs[0].read_text() + logs[1].read_text()


def _join_later(tmp_path: Path) -> None:
    with _three_nodes(tag="e1") as net:
        _join_later_on(net, tmp_path)


def _join_later_on(net, tmp_path: Path) -> None:
    out, endpoint = tmp_path / "run", f"{net['e0'].addr}:29632"
    logs = [tmp_path / f"{p.name}.log" for p in net]
    procs = [_start(pod, out, log, endpoint) for pod, log in zip(list(net)[:2], logs[:2])]
    _wait(lambda: len(_epochs(out)) >= 1, 240, "epoch 1 on 2 nodes", logs[:2])
    procs.append(_start(net["e2"], out, logs[2], endpoint))
    for proc in procs:
        assert proc.wait(timeout=600) == 0, "\n".join(p.read_text() for p in logs)
    records = _finished_exactly(out)
    assert records[0]["world_size"] == 2 and records[-1]["world_size"] == 3
    # Node 0 names the newcomer and ends on 3 nodes. On a loaded machine torch may first form a round
    # of 2 without node 1, whose workers were still stopping when the newcomer's round closed (min
    # nodes 2): "node <1> left and node <2> joined: ... 2 nodes", then "node <1> joined: ... 3 nodes".
    text = logs[0].read_text()
    assert f"node {net['e2'].addr} joined" in text, text
    assert "joined: the job goes on with 3 nodes (3 workers)" in text, text


RUNS = Background(at_once=2)


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    """Both runs at once, each on three pods of its own (tests/background.py)."""
    reason = pods_unavailable()
    if reason:
        pytest.skip(reason)
    with RUNS.started(request, tmp_path_factory) as started:
        yield started


@pytest.fixture
def scenario(request, runs):
    return Background.scenario(request, runs)


@RUNS.of(_lose_a_node)
def test_a_lost_node_is_one_line_and_the_others_finish(scenario):
    scenario.result()


@RUNS.of(_join_later)
def test_a_node_started_later_joins_at_the_next_membership_change(scenario):
    scenario.result()
