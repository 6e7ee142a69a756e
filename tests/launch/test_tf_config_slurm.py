"""TF_CONFIG under srun's per-task shim, in the real Slurm cluster fixture (tests/cluster_slurm): the
same cheap check as test_tf_config_paths.py."""

from __future__ import annotations

import subprocess

import pytest
from tf_config_checks import PRINT, check_tf_config, tf_config_reports

pytestmark = pytest.mark.multiprocess


def test_srun_through_the_shim_gives_each_task_tf_config(slurm, tmp_path):
    """``srun python -m shoal.launch.as_torchrun -- python SCRIPT``: rank 0's shim serves the exchange
    at MASTER_ADDR:MASTER_PORT (the Slurm node's name, a port from the job id)."""
    shim = ["python", "-m", "shoal.launch.as_torchrun", "--"]
    proc = subprocess.run(
        ["srun", "-n", "2", *shim, "python", str(PRINT), str(tmp_path)],
        env={**slurm.env, "SHOAL_TF_CONFIG": "1"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{slurm.logs()}"
    reports = tf_config_reports(tmp_path, 2)
    hosts = check_tf_config(reports, 2)
    assert {r["MASTER_ADDR"] for r in reports} == {slurm.hostname}
    assert len(set(hosts)) == 1  # both tasks on the one node, on its address toward the master
