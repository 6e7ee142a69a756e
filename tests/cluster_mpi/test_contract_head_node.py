"""Issue 19: `shoal launch --hosts localhost:2 -- script.py`, the one command from the head node.

With Open MPI on PATH the transport is mpirun, and an unchanged torchrun-style script failed with
`environment variable RANK expected, but not set`. Each rank now runs through the shim that gives it
torchrun's variables (shoal.launch.as_torchrun); both transports must give the same contract.
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest

import warm
from contract.torchrun import SCRIPT, check_report, report_from_output
from procs import launcher_free_env

pytestmark = pytest.mark.multiprocess


def _env() -> dict[str, str]:
    return launcher_free_env()


@pytest.mark.parametrize("via", [pytest.param("auto", id="auto-is-mpirun"), "ssh"])
def test_launch_from_the_head_node_gives_torchruns_contract(via, tmp_path):
    if via == "auto" and shutil.which("mpirun") is None:
        pytest.skip("Open MPI's mpirun is not installed: auto would be ssh")
    proc = warm.run(
        [sys.executable, "-m", "shoal", "launch", "--hosts", "localhost:2", "--via", via, "--", str(SCRIPT)],
        env=_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if via == "auto":
        assert "shoal launch: mpirun, 2 processes" in proc.stderr
    ranks = check_report(report_from_output(proc.stdout), world=2, nodes=1)
    assert [v["LOCAL_RANK"] for v in ranks] == ["0", "1"] and {v["LOCAL_WORLD_SIZE"] for v in ranks} == {"2"}
    # usable cores // ranks here, as `shoal run` sets it (torchrun: 1)
    assert {v["OMP_NUM_THREADS"] for v in ranks} == {str(max(1, len(os.sched_getaffinity(0)) // 2))}
