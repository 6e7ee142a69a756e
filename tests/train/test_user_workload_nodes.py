"""A user's workload on the paths beyond one launcher: two node launchers meeting over a static
rendezvous (on loopback, one process each), and an elastic restart after a worker crashed mid-run.
Both must end where one uninterrupted single-node run of the same seed ends: the same weights
(that reference run is made once, and both tests compare with it)."""

from __future__ import annotations

import socket
import subprocess

import pytest
import torch

import warm
from conftest import run_shoal, shoal_cmd
from workloads.user_workload_files import GOOD, write

pytestmark = pytest.mark.multiprocess

COMMON = ["--seed", "5", "--no-progress", "--device", "cpu", "--checkpoint-every", "1"]

CRASHY = """

import os


class Crashy(Tiny):
    \"\"\"Tiny whose rank 1 dies (os._exit) in epoch 2 of the first attempt only.\"\"\"

    def build_model(self, cfg, num_classes):
        return CrashOnce(super().build_model(cfg, num_classes))


class CrashOnce(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, x):
        self.calls += 1
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0"
        if self.calls > 8 and first_attempt and os.environ.get("RANK") == "1":
            os._exit(3)
        return self.inner(x)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _weights(out) -> dict[str, torch.Tensor]:
    state = torch.load(out / "model.pt", weights_only=True)
    return {k.removeprefix("inner."): v for k, v in state.items()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, torch.Tensor]:
    """The user's Tiny on one node of 2 workers, uninterrupted: the weights both tests must reach."""
    directory = tmp_path_factory.mktemp("reference")
    write(directory, "my_workload.py", GOOD)
    ref = run_shoal("train", "my_workload.py:Tiny", "--nproc", "2", "--out", "ref", *COMMON, cwd=directory, timeout=300)
    assert ref.returncode == 0, ref.stderr
    return _weights(directory / "ref")


def test_two_node_launchers_train_a_users_workload_as_one_node_would(reference, tmp_path):
    write(tmp_path, "my_workload.py", GOOD)
    port = str(_free_port())
    nodes = [
        warm.popen(
            [
                *shoal_cmd("train", "my_workload.py:Tiny", "--nproc", "1", "--nnodes", "2", "--node-rank", str(i)),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                port,
                "--out",
                "nodes",
                *COMMON,
            ],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for i in (0, 1)
    ]
    outputs = [node.communicate(timeout=300) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    assert "world size 2" in outputs[0][0] or "2 processes" in outputs[0][0], outputs[0][0]
    got = _weights(tmp_path / "nodes")
    assert got.keys() == reference.keys()
    for key in reference:
        torch.testing.assert_close(got[key], reference[key], rtol=0, atol=1e-6)


def test_an_elastic_restart_resumes_a_users_workload_exactly(reference, tmp_path):
    write(tmp_path, "my_workload.py", GOOD + CRASHY)
    run = run_shoal(
        "train", "my_workload.py:Crashy", "--nproc", "2", "--max-restarts", "1", "--out", "crashed", *COMMON,
        cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "restart" in (run.stdout + run.stderr).lower(), run.stdout + run.stderr
    assert "resuming from" in run.stdout, run.stdout
    got = _weights(tmp_path / "crashed")
    for key in reference:
        torch.testing.assert_close(got[key], reference[key], rtol=0, atol=1e-6)
