"""The torchrun contract under `shoal run --nproc 2`, the path every per-node launcher uses.

(`shoal launch --hosts ... --via ssh`, sbatch's launchers and Kubeflow pods all start `shoal run`;
their own tests run the same script: see docs/LAUNCHERS.md.)
"""

from __future__ import annotations

import os
import sys

import pytest

import warm
from contract.torchrun import SCRIPT, check_report, report_from_output

pytestmark = pytest.mark.multiprocess


def test_shoal_run_gives_torchruns_contract(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OMPI_", "PMI_", "SLURM_", "TORCHELASTIC_", "PET_"))
        and k not in ("SHOAL_ENV", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "OMP_NUM_THREADS")
    }
    proc = warm.run(
        [sys.executable, "-m", "shoal", "run", "--nproc", "2", "--max-restarts", "1", str(SCRIPT)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = check_report(report_from_output(proc.stdout), world=2, nodes=1, restarts=1)
    assert [v["LOCAL_RANK"] for v in ranks] == ["0", "1"]
    assert {v["MASTER_ADDR"] for v in ranks} == {"127.0.0.1"}
    assert {v["OMP_NUM_THREADS"] for v in ranks} == {str(max(1, len(os.sched_getaffinity(0)) // 2))}
