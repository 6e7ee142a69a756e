"""The torchrun contract in a Flyte task: its function's workers, started by ``shoal.run`` under real
flytekit (local execution), see torchrun's variables with consistent values."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from contract.torchrun import check_report, report_from_output

pytestmark = pytest.mark.multiprocess
DRIVER = Path(__file__).with_name("flyte_contract_driver.py")


def test_a_flyte_tasks_function_workers_see_torchruns_contract(tmp_path):
    pytest.importorskip("flytekit")
    from flyte.flyte_harness import TIMEOUT, flyte_environment

    env = flyte_environment(tmp_path)
    env.pop("OMP_NUM_THREADS", None)
    proc = subprocess.run(
        [sys.executable, str(DRIVER)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = check_report(report_from_output(proc.stdout), world=2, nodes=1)
    assert [v["LOCAL_RANK"] for v in ranks] == ["0", "1"]
