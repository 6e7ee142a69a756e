"""``shoal doctor``'s ``lighthouse`` row: a real torchft lighthouse answers; a closed port, a port held
on node 0 and a bad URL are each named, with a HINT."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import jsonschema
import pytest

import warm
from shoal.doctor.schema import SCHEMA
from shoal.launch.ports import find_free_port


def _doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("SHOAL_ENV", "TORCHFT_LIGHTHOUSE")}
    return warm.run(
        [sys.executable, "-m", "shoal", "doctor", "--json", *args],
        capture_output=True, text=True, timeout=120, env={**base, **(env or {})},
    )  # fmt: skip


def _lighthouse_row(proc: subprocess.CompletedProcess) -> dict:
    document = json.loads(proc.stdout)
    jsonschema.validate(document, SCHEMA)
    (node,) = document["nodes"]
    (row,) = [c for c in node["checks"] if c["name"] == "lighthouse"]
    return row


def test_a_running_lighthouse_answers_and_a_closed_port_is_named():
    pytest.importorskip("torchft")
    from shoal.train.ft.lighthouse import Lighthouse

    with Lighthouse("127.0.0.1") as lighthouse:
        up = _doctor("--lighthouse", lighthouse.url)
        # The same endpoint through torchft's own variable, which the groups read.
        from_env = _doctor(env={"TORCHFT_LIGHTHOUSE": lighthouse.url})
    row = _lighthouse_row(up)
    assert row["status"] == "ok" and f"{lighthouse.url} answers" in row["summary"], row
    assert _lighthouse_row(from_env)["status"] == "ok"

    closed = f"http://127.0.0.1:{find_free_port()}"
    down = _doctor("--lighthouse", closed)
    assert down.returncode == 1
    row = _lighthouse_row(down)
    assert row["status"] == "fail" and f"nothing listens on {closed}" in row["summary"], row
    assert "start node 0 first" in row["hint"]


def test_fault_tolerance_on_node_0_needs_the_lighthouse_port_free():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        taken = _doctor("--fault-tolerance", "--master", f"127.0.0.1:{port}")
    row = _lighthouse_row(taken)
    assert taken.returncode == 1 and row["status"] == "fail", row
    assert f"port {port} is already in use" in row["summary"] and "lighthouse listens on this port" in row["summary"]
    assert "ss -ltnp" in row["hint"]
    (node,) = json.loads(taken.stdout)["nodes"]
    master_port = next(c for c in node["checks"] if c["name"] == "master-port")
    assert master_port["status"] == "fail"  # the port is checked once, and both rows say it

    free = _lighthouse_row(_doctor("--fault-tolerance"))  # one node: any free port on loopback
    assert free["status"] == "ok" and "127.0.0.1" in free["summary"], free


def test_a_bad_lighthouse_url_is_one_line_and_a_hint():
    proc = warm.run([sys.executable, "-m", "shoal", "doctor", "--lighthouse", "nope:x"], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "bad lighthouse URL 'nope:x'" in proc.stderr and "HINT: write it as http://HOST:PORT" in proc.stderr
