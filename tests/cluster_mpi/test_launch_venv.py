"""``.venv/bin/shoal launch`` with the virtual environment not activated (issue 12, "fixes found").

A new user runs shoal by its path, with a PATH on which ``python`` is the system's (no torch there).
Every rank must still run the script with the interpreter that runs shoal, and see that
interpreter's directory first on its PATH (so that ``shoal`` and ``python`` started by the script
are the environment's too), through mpirun and through the SSH path alike.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess
SCRIPT = str(Path(__file__).parent / "scripts" / "env_report.py")
VENV_BIN = os.path.dirname(sys.executable)
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


@pytest.mark.parametrize(
    "via",
    [
        pytest.param("mpirun", marks=pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun")),
        "ssh",
    ],
)
def test_an_unactivated_venv_runs_every_rank_with_its_own_interpreter(tmp_path, via):
    shoal = os.path.join(VENV_BIN, "shoal")
    if not os.path.exists(shoal):
        pytest.skip(f"{shoal} is not installed (pip install -e .)")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH") and not k.startswith("OMPI_")}
    env["PATH"] = SYSTEM_PATH  # not activated: the venv's bin is not on PATH
    proc = subprocess.run(
        [shoal, "launch", "--hosts", "localhost:2", "--via", via, "--", SCRIPT, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reports = [json.loads((tmp_path / f"env-rank{r}.json").read_text()) for r in range(2)]
    for report in reports:
        assert os.path.realpath(report["executable"]) == os.path.realpath(sys.executable)
        assert report["path"][0] == VENV_BIN
        assert report["shoal"] == shoal
