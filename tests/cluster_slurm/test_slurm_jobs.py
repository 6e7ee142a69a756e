"""Real Slurm (slurmctld + slurmd + munge, one node): srun steps and sbatch scripts of `shoal launch slurm`.

The cluster is the session fixture of :mod:`slurm_cluster`; every client call carries its
``SLURM_CONF``. Each test costs a few seconds of Slurm plus one torch import per process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess

INIT_SCRIPT = Path(__file__).resolve().parents[1] / "cluster_mpi" / "scripts" / "shoal_init_allreduce.py"
LAUNCH = [sys.executable, "-m", "shoal.cli.launch"]


def _results(out: Path, n: int) -> list[dict]:
    found = sorted(out.glob("rank*.json"))
    assert len(found) == n, f"expected {n} result files, got {[p.name for p in found]}"
    return sorted((json.loads(p.read_text()) for p in found), key=lambda r: r["rank"])


def _run_facts(run_dir: Path) -> tuple[str, int]:
    """(launcher, world size) recorded by `shoal train` in config.json."""
    config = json.loads((run_dir / "config.json").read_text())
    facts = {**config, **config.get("extra", {})}
    return facts["environment"], facts["world_size"]


def _check(proc: subprocess.CompletedProcess, cluster) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}\n{cluster.logs()}"


def test_srun_two_tasks_of_shoal_train(slurm, tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        ["srun", "-n", "2", "shoal", "train", "digits", "--epochs", "1", "--device", "cpu", "--out", str(run_dir)],
        env=slurm.env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    _check(proc, slurm)
    assert _run_facts(run_dir) == ("slurm", 2)
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 1
    assert "via slurm" in proc.stdout + proc.stderr


def test_sbatch_of_the_rendered_script_one_launcher_per_node(slurm, tmp_path):
    run_dir = tmp_path / "run"
    rendered = subprocess.run(
        [
            *LAUNCH,
            "slurm",
            "--nodes",
            "1",
            "--nproc-per-node",
            "2",
            "--job-name",
            "shoal-test",
            "--output",
            str(tmp_path / "job-%j.out"),
            "--dry-run",
            "--",
            "shoal",
            "train",
            "digits",
            "--epochs",
            "1",
            "--device",
            "cpu",
            "--out",
            str(run_dir),
        ],
        env=slurm.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    _check(rendered, slurm)
    assert "srun --ntasks-per-node=1" in rendered.stdout and "--rdzv-backend c10d" in rendered.stdout
    script = tmp_path / "job.sbatch"
    script.write_text(rendered.stdout)

    submitted = subprocess.run(
        ["sbatch", "--parsable", str(script)], env=slurm.env, capture_output=True, text=True, timeout=60
    )
    _check(submitted, slurm)
    job_id = submitted.stdout.strip().split(";")[0]
    info = slurm.wait_job(job_id, timeout=240)
    output = (tmp_path / f"job-{job_id}.out").read_text()
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), f"{info}\n{output}\n{slurm.logs()}"
    assert f"shoal: job {job_id}, 1 nodes, rendezvous {slurm.hostname}:" in output
    assert _run_facts(run_dir) == ("torchrun", 2)  # the per-node launcher's workers


def test_sbatch_one_task_per_process_submitted_by_shoal_launch(slurm, tmp_path):
    """No --dry-run: shoal launch writes the script, submits it and prints the job id."""
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "tasks.sbatch"
    proc = subprocess.run(
        [
            *LAUNCH,
            "slurm",
            "--nodes",
            "1",
            "--nproc-per-node",
            "2",
            "--one-task-per-process",
            "--script",
            str(script),
            "--output",
            str(tmp_path / "tasks-%j.out"),
            "--",
            str(INIT_SCRIPT),
            str(out),
        ],
        env=slurm.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    _check(proc, slurm)
    job_id = proc.stdout.strip()
    assert job_id.isdigit(), proc.stdout
    assert f"submitted batch job {job_id}" in proc.stderr
    assert "srun --kill-on-bad-exit=1" in script.read_text()
    info = slurm.wait_job(job_id, timeout=240)
    output = (tmp_path / f"tasks-{job_id}.out").read_text()
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), f"{info}\n{output}\n{slurm.logs()}"
    results = _results(out, 2)
    assert [r["scheme"] for r in results] == ["slurm", "slurm"]
    assert [(r["rank"], r["local_rank"], r["world_size"], r["sum"]) for r in results] == [
        (0, 0, 2, 3.0),
        (1, 1, 2, 3.0),
    ]
    assert results[0]["main_address"] == slurm.hostname
    assert "all_reduce over 2 ranks (slurm): 3.0" in output


def test_srun_runs_the_all_reduce_demo(slurm):
    proc = subprocess.run(
        ["srun", "-n", "2", "shoal", "demo", "all-reduce"], env=slurm.env, capture_output=True, text=True, timeout=180
    )
    _check(proc, slurm)
    assert "all 2 ranks got the right sum" in proc.stdout


# ---- the torchrun contract (docs/LAUNCHERS.md): an unchanged torchrun-style script on each path ----


def test_srun_through_the_shim_gives_torchruns_contract(slurm, tmp_path):
    """A user's own srun: `srun python -m shoal.launch.as_torchrun -- python SCRIPT` (docs/LAUNCHERS.md)."""
    from contract.torchrun import SCRIPT, check_report, report_from_file

    report = tmp_path / "contract.json"
    shim = ["python", "-m", "shoal.launch.as_torchrun", "--"]
    proc = subprocess.run(
        ["srun", "-n", "2", *shim, "python", str(SCRIPT), str(report)],
        env=slurm.env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    _check(proc, slurm)
    ranks = check_report(report_from_file(report), world=2, nodes=1)
    assert {v["MASTER_ADDR"] for v in ranks} == {slurm.hostname}
    assert ranks[0]["TORCHELASTIC_RUN_ID"].startswith("slurm-")  # the job and step: one id for the job


@pytest.mark.parametrize("layout", [[], ["--one-task-per-process"]], ids=["launcher-per-node", "one-task-per-process"])
def test_sbatch_gives_torchruns_contract(slurm, tmp_path, layout):
    from contract.torchrun import SCRIPT, check_report, report_from_file

    report = tmp_path / "contract.json"
    proc = subprocess.run(
        [*LAUNCH, "slurm", "--nproc-per-node", "2", *layout, "--script", str(tmp_path / "job.sbatch")]
        + ["--output", str(tmp_path / "job-%j.out"), "--", str(SCRIPT), str(report)],
        env=slurm.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    _check(proc, slurm)
    job_id = proc.stdout.strip()
    info = slurm.wait_job(job_id, timeout=240)
    output = (tmp_path / f"job-{job_id}.out").read_text()
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), f"{info}\n{output}\n{slurm.logs()}"
    ranks = check_report(report_from_file(report), world=2, nodes=1)
    assert [v["LOCAL_RANK"] for v in ranks] == ["0", "1"]


def test_slurms_warning_before_the_time_limit_stops_a_plain_script_with_a_hint(slurm, tmp_path):
    """Issue 49: the rendered script's ``--signal=USR1@60`` under a one-minute ``--time``: Slurm sends
    SIGUSR1 at once (the limit is under 60 s away); a plain script (no ctx.preemption()) stops, and
    the launcher says that this is Slurm's pre-timeout warning and what to do."""
    from shoal.launch.core import SLURM_WARNING_HINT

    script = tmp_path / "plain.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(600)\n")
    rendered = subprocess.run(
        [*LAUNCH, "slurm", "--nodes", "1", "--nproc", "1", "--time", "1", "--output", str(tmp_path / "job-%j.out"),
         "--dry-run", "--", str(script)],
        env=slurm.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    _check(rendered, slurm)
    assert "#SBATCH --signal=USR1@60" in rendered.stdout.splitlines()
    (tmp_path / "job.sbatch").write_text(rendered.stdout)
    submitted = subprocess.run(
        ["sbatch", "--parsable", str(tmp_path / "job.sbatch")],
        env=slurm.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    _check(submitted, slurm)
    job_id = submitted.stdout.strip().split(";")[0]
    info = slurm.wait_job(job_id, timeout=240)
    output = (tmp_path / f"job-{job_id}.out").read_text()
    assert info["JobState"] == "FAILED", f"{info}\n{output}"  # stopped before the limit, not TIMEOUT
    assert "started" in output.splitlines(), output
    ours = [line for line in output.splitlines() if line.startswith(("shoal run: stopped", "HINT: "))]
    assert ours == ["shoal run: stopped by SIGUSR1; workers stopped", f"HINT: {SLURM_WARNING_HINT}"], output
