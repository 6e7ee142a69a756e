"""Fixtures for the tracking tests: an isolated environment for the tools and a real ``mlflow server``
(SQLite backend store, local artifact root, 127.0.0.1 only) shared by the whole session."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from procs import wait_for
from tracking.harness import BIN, answers, free_port, group_pids, non_loopback_sockets, tool_environment


@pytest.fixture
def tool_env(tmp_path) -> dict[str, str]:
    return tool_environment(tmp_path / "home")


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real ``mlflow server`` on 127.0.0.1 (SQLite store, local artifact root); yields its URI.

    Stopped by its process group's id (the PID of the process started here). At the end every TCP
    socket its processes hold is checked: local and remote addresses are loopback only.
    """
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    env = tool_environment(root / "home")
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"  # no GenAI job workers: a tracking server only
    cmd = [
        str(BIN / "mlflow"),
        "server",
        "--backend-store-uri",
        f"sqlite:///{root / 'mlflow.db'}",
        "--default-artifact-root",
        (root / "artifacts").as_uri(),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    log = open(root / "server.log", "w")  # noqa: SIM115 - closed after the server stops
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        wait_for(
            lambda: answers(f"{uri}/health"), 180, 0.3, "the mlflow server answering",
            unless=lambda: proc.poll() is not None, details=lambda: (root / "server.log").read_text()[-3000:],
        )  # fmt: skip
        yield uri
        foreign = non_loopback_sockets(group_pids(proc.pid))
        assert not foreign, f"mlflow server talked beyond loopback: {foreign}"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()
