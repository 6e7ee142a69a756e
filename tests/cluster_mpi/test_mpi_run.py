"""Real Open MPI (Debian's openmpi-bin) and MPICH-style PMI variables, on this machine.

The mpirun command lines come from :func:`shoal.jobs.hosts.render.render_mpirun`, the way
``shoal launch mpirun`` builds them; the scripts are unchanged whatever launches them. Each test
starts two processes that import torch (a few seconds each on 2 cores).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from procs import launcher_free_env
from shoal.jobs.hosts.options import Here, HostsOptions, forwarded_env
from shoal.jobs.hosts.render import render_mpirun
from shoal.jobs.spec import JobSpec
from shoal.launch.ports import find_free_port

pytestmark = pytest.mark.multiprocess

SCRIPT = str(Path(__file__).parent / "scripts" / "shoal_init_allreduce.py")
needs_mpirun = pytest.mark.skipif(
    shutil.which("mpirun") is None,
    reason="Open MPI's mpirun is not installed (scripts/install-system-deps.sh installs openmpi-bin)",
)


def _env(**extra: str) -> dict[str, str]:
    """This venv first on PATH (mpirun's ranks run `shoal` and `python` by name), no launcher leftovers."""
    return launcher_free_env(**extra)


def _results(out: Path, n: int) -> list[dict]:
    found = sorted(out.glob("rank*.json"))
    assert len(found) == n, f"expected {n} result files, got {[p.name for p in found]}"
    return sorted((json.loads(p.read_text()) for p in found), key=lambda r: r["rank"])


def _mpirun(command: tuple[str, ...], env: dict[str, str], np: int = 2) -> list[str]:
    spec = JobSpec(command=command, master_port=find_free_port(), env=forwarded_env(env))
    return render_mpirun(spec, HostsOptions(np=np), Here.detect())


@needs_mpirun
def test_mpirun_runs_a_shoal_init_script(tmp_path):
    env = _env()
    argv = _mpirun((SCRIPT, str(tmp_path)), env)
    assert "-bind-to" in argv and "MASTER_ADDR=127.0.0.1" in argv
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = _results(tmp_path, 2)
    assert [r["scheme"] for r in results] == ["openmpi", "openmpi"]
    assert [(r["rank"], r["local_rank"], r["world_size"], r["local_world_size"]) for r in results] == [
        (0, 0, 2, 2),
        (1, 1, 2, 2),
    ]
    assert {r["sum"] for r in results} == {3.0}
    assert "all_reduce over 2 ranks (openmpi): 3.0" in proc.stdout


@needs_mpirun
def test_mpirun_runs_shoal_train(tmp_path):
    env = _env()
    run_dir = tmp_path / "run"
    argv = _mpirun(("shoal", "train", "digits", "--epochs", "1", "--device", "cpu", "--out", str(run_dir)), env)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    config = json.loads((run_dir / "config.json").read_text())
    facts = {**config, **config.get("extra", {})}
    assert (facts["environment"], facts["world_size"]) == ("openmpi", 2)
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 1
    assert "via openmpi" in proc.stdout + proc.stderr


def test_pmi_variables_of_mpich_style_launchers(tmp_path):
    """What Hydra's mpiexec (MPICH, Intel MPI) gives each rank: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID..."""
    port = str(find_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, SCRIPT, str(tmp_path)],
            env=_env(
                PMI_RANK=str(rank), PMI_SIZE="2", MPI_LOCALRANKID=str(rank), MPI_LOCALNRANKS="2", MASTER_PORT=port
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outputs)
    results = _results(tmp_path, 2)
    assert [(r["scheme"], r["rank"], r["local_rank"], r["world_size"], r["sum"]) for r in results] == [
        ("pmi", 0, 0, 2, 3.0),
        ("pmi", 1, 1, 2, 3.0),
    ]


@needs_mpirun
@pytest.mark.parametrize("demo", ["all-reduce", "send-recv"])
def test_mpirun_runs_the_demos(demo):
    env = _env()
    proc = subprocess.run(_mpirun(("shoal", "demo", demo), env), env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Two ranks of one job: both found their rank and world size in Open MPI's variables.
    assert "[rank 1/2 on" in proc.stdout and "2 ranks" in proc.stdout
