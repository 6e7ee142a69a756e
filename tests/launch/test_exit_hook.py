"""The exit hook of ``shoal run``'s Python workers (``shoal.launch.exit_hook``): a gloo group the
script leaves open is left at exit, and the worker's environment is the user's again before the
script runs. Real ``shoal run`` launches of two gloo workers.

Why: with torch 2.14/2.15 and gloo, a worker whose script never calls ``destroy_process_group``
(Lightning's ``Trainer.fit`` does not) aborts with SIGABRT after its work about 1 run in 8 here
(CI, 2026-11-24: ``test_clients.py::test_shoal_launch_hosts[lightning_ddp-ssh]``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_shoal

SCRIPT = """
import atexit, json, os, sys

registered_before = atexit._ncallbacks()  # CPython: the exit hook's one, or none
import torch
import torch.distributed as dist

out = sys.argv[1]
rank = int(os.environ["RANK"])
original = dist.destroy_process_group


def recorded():  # what the exit hook calls (by name, on the module): noted in a file
    with open(os.path.join(out, f"left-{rank}"), "a") as f:
        f.write(f"initialized={dist.is_initialized()}\\n")
    original()


dist.destroy_process_group = recorded
dist.init_process_group("gloo")
value = torch.ones(1)
dist.all_reduce(value)
import sitecustomize

seen = {
    "sum": value.item(),
    "PYTHONPATH": os.environ.get("PYTHONPATH"),
    "marker": "SHOAL_ORIGINAL_PYTHONPATH" in os.environ,
    "hook_on_path": any(p.rstrip("/").endswith("exit_hook") for p in sys.path),
    "user_sitecustomize": getattr(sitecustomize, "MARK", None),
    "registered_before": registered_before,
}
with open(os.path.join(out, f"seen-{rank}.json"), "w") as f:
    json.dump(seen, f)
if sys.argv[2] == "destroy":
    dist.destroy_process_group()
"""


def _job(tmp_path: Path) -> tuple[Path, Path, str]:
    """The script, its output directory, and a PYTHONPATH whose first entry holds the user's own
    ``sitecustomize``."""
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    user_site = tmp_path / "site"
    user_site.mkdir(exist_ok=True)
    (user_site / "sitecustomize.py").write_text("MARK = 'user'\n")
    out = tmp_path / "out"
    out.mkdir()
    return script, out, os.pathsep.join(p for p in (str(user_site), os.environ.get("PYTHONPATH")) if p)


def _launch(tmp_path: Path, how: str, **env: str):
    script, out, path = _job(tmp_path)
    proc = run_shoal("run", "--nproc", "2", str(script), str(out), how, env={"PYTHONPATH": path, **env})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, path


@pytest.mark.multiprocess
def test_a_gloo_group_left_open_is_left_at_exit_and_the_environment_is_the_users(tmp_path):
    out, path = _launch(tmp_path, "keep")
    for rank in (0, 1):
        seen = json.loads((out / f"seen-{rank}.json").read_text())
        # The user's PYTHONPATH, their own sitecustomize imported, nothing of shoal's left.
        assert seen == {
            "sum": 2.0, "PYTHONPATH": path, "marker": False, "hook_on_path": False, "user_sitecustomize": "user",
            "registered_before": 1,
        }  # fmt: skip
        assert (out / f"left-{rank}").read_text() == "initialized=True\n"


@pytest.mark.multiprocess
def test_a_group_the_script_left_is_not_left_twice_and_the_hook_can_be_turned_off(tmp_path):
    (tmp_path / "a").mkdir()
    out, _ = _launch(tmp_path / "a", "destroy")
    for rank in (0, 1):
        assert (out / f"left-{rank}").read_text() == "initialized=True\n"  # the script's own call, once
    # Off: nothing registered before the script (it leaves its group itself: without the hook, a
    # group left open may abort the worker at exit, the very failure the hook prevents).
    (tmp_path / "b").mkdir()
    out, path = _launch(tmp_path / "b", "destroy", SHOAL_EXIT_HOOK="0")
    for rank in (0, 1):
        seen = json.loads((out / f"seen-{rank}.json").read_text())
        assert (seen["registered_before"], seen["user_sitecustomize"], seen["PYTHONPATH"]) == (0, "user", path)


@pytest.mark.multiprocess
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed (openmpi-bin)")
@pytest.mark.parametrize("report_status", [False, True], ids=["as_torchrun", "rank_status"])
def test_ranks_started_by_mpirun_get_the_hook_too(tmp_path, report_status):
    # Each rank is given torchrun's variables and the hook: by shoal.launch.as_torchrun, which execs
    # the script's Python in the process mpirun started (`shoal launch mpirun`), or by
    # shoal.jobs.hosts.rank_status, which runs it and reports its status (`shoal launch --via
    # mpirun`; CI, 2026-11-24: the unchanged Lightning script aborted at exit on this path, which
    # had no hook).
    from shoal.jobs.hosts.options import Here, HostsOptions, forwarded_env
    from shoal.jobs.hosts.render import render_mpirun
    from shoal.jobs.spec import JobSpec
    from shoal.launch.ports import find_free_port

    script, out, path = _job(tmp_path)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OMPI_", "PMI_", "PMIX_", "SLURM_"))
        and k not in ("SHOAL_ENV", "MASTER_ADDR", "MASTER_PORT")
    }
    env["PYTHONPATH"] = path
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    command = (sys.executable, str(script), str(out), "keep")
    spec = JobSpec(command=command, master_port=find_free_port(), env=forwarded_env(env))
    argv = render_mpirun(spec, HostsOptions(np=2), Here.detect(), report_status=report_status)
    assert ("shoal.jobs.hosts.rank_status" in argv) == report_status
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in (0, 1):
        seen = json.loads((out / f"seen-{rank}.json").read_text())
        assert (seen["registered_before"], seen["user_sitecustomize"], seen["PYTHONPATH"]) == (1, "user", path)
        assert (out / f"left-{rank}").read_text() == "initialized=True\n"
