"""Starting the Horovod-style test scripts under each launcher, with a clean environment.

Each launcher is the real one: ``python`` (one process), ``torchrun --standalone``, Open MPI's
``mpirun`` (rank variables OMPI_COMM_WORLD_*), ``python -m shoal run`` and Slurm's ``srun``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import warm
from shoal.launch.ports import find_free_port

SCRIPTS = Path(__file__).parent / "scripts"
TUTORIAL = SCRIPTS / "hvd_tutorial.py"
API = SCRIPTS / "hvd_api.py"
VS_DDP = SCRIPTS / "hvd_vs_ddp.py"
BAD_INPUT = SCRIPTS / "hvd_bad_input.py"
COLLECTIVES = SCRIPTS / "hvd_collectives.py"

LAUNCHER_LEFTOVERS = ("OMPI_", "PMI_", "PMIX_", "SLURM_", "TORCHELASTIC_", "GROUP_", "ROLE_")
JOB_VARIABLES = ("SHOAL_ENV", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")

needs_mpirun = pytest.mark.skipif(
    shutil.which("mpirun") is None,
    reason="Open MPI's mpirun is not installed (scripts/install-system-deps.sh installs openmpi-bin)",
)


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any launcher's variables, this venv first on PATH, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(LAUNCHER_LEFTOVERS) and k not in JOB_VARIABLES and not k.startswith("HOROVOD_")
    }
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def command(launcher: str, np: int, script: Path, *args: str) -> list[str]:
    """The command line that runs ``script ARGS`` as ``np`` ranks under ``launcher``."""
    target = [str(script), *args]
    if launcher == "python":
        assert np == 1, "plain python is one process"
        return [sys.executable, *target]
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(np), *target]
    if launcher == "shoal-run":
        return [sys.executable, "-m", "shoal", "run", "--nproc", str(np), *target]
    if launcher == "mpirun":
        port = str(find_free_port())
        return [
            "mpirun", "-np", str(np), "--allow-run-as-root", "--oversubscribe",
            "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={port}", "-x", "PATH", "-x", "OMP_NUM_THREADS",
            sys.executable, *target,
        ]  # fmt: skip
    if launcher == "srun":
        return ["srun", "-n", str(np), sys.executable, *target]
    raise ValueError(launcher)


def run(launcher: str, np: int, script: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 240,
        warm_script: bool = False):  # fmt: skip
    """Run and return the CompletedProcess (text, both streams captured); never hangs past ``timeout``.
    shoal's and torchrun's launchers start warm (tests/warm.py); the ranks they start, fresh; a plain
    ``python SCRIPT`` too, unless ``warm_script`` (its start-up is not what the test looks at)."""
    return warm.run(
        command(launcher, np, script, *args),
        script=warm_script,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def check(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


def results(out: Path, n: int) -> list[dict]:
    """The ``rank{r}.json`` files the scripts write, in rank order; exactly ``n`` of them."""
    found = sorted(out.glob("rank*.json"))
    assert len(found) == n, f"expected {n} result files, got {[p.name for p in found]}"
    return sorted((json.loads(p.read_text()) for p in found), key=lambda r: r["rank"])
