"""``shoal env``: called in-process through its parser, and as a real subprocess."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from unittest import mock

import pytest

from shoal.cli import env as env_cmd
from shoal.errors import ShoalError

OMPI = {
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}


def run_env(argv: list[str], environ: dict[str, str]) -> int:
    parser = argparse.ArgumentParser(prog="shoal")
    env_cmd.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["env", *argv])
    with mock.patch.dict(os.environ, environ, clear=True):
        return args.func(args)


def test_json_report_under_mpirun(capsys):
    assert run_env(["--json", "--device", "cpu"], OMPI) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["scheme"] == "openmpi"
    assert report["reason"][:2] == ["OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2"]
    assert (report["rank"], report["world_size"], report["local_rank"], report["local_world_size"]) == (1, 2, 1, 2)
    assert (report["node_rank"], report["num_nodes"]) == (0, 1)
    assert (report["main_address"], report["main_port"]) == ("127.0.0.1", 29500)
    assert (report["device"], report["backend"]) == ("cpu", "gloo")
    assert report["torch_env"]["RANK"] == "1" and report["torch_env"]["MASTER_ADDR"] == "127.0.0.1"


def test_text_report_names_every_quantity(capsys):
    assert run_env(["--device", "cpu"], {}) == 0
    out = capsys.readouterr().out
    assert "scheme:       local" in out
    assert "no launcher variables found" in out
    assert "rank:         0 of 1 (world size)" in out
    assert "local rank:   0 of 1 (local world size)" in out
    assert "node:         0 of 1" in out
    assert "main address: 127.0.0.1:29500" in out
    assert "device:       cpu" in out and "backend:      gloo" in out


def test_scheme_option_forces_like_shoal_env(capsys):
    with pytest.raises(ShoalError, match="slurm: SLURM_STEP_ID, SLURM_PROCID"):
        run_env(["--scheme", "slurm"], {})
    assert run_env(["--json", "--scheme", "local", "--device", "cpu"], OMPI) == 0
    assert json.loads(capsys.readouterr().out)["scheme"] == "local"


def test_impossible_backend_is_a_shoal_error():
    with pytest.raises(ShoalError, match="nccl"):
        run_env(["--device", "cpu", "--backend", "nccl"], {})


def test_help_ends_with_examples():
    parser = argparse.ArgumentParser(prog="shoal")
    sub = env_cmd.register(parser.add_subparsers(dest="command"))
    text = sub.format_help()
    assert text.rstrip().splitlines()[-1].strip().startswith("SHOAL_ENV=slurm shoal env")
    assert "mpirun -np 2 shoal env" in text


def test_detection_does_not_import_torch():
    # shoal/__init__.py imports torch for the public API, so load the package shell without running it
    code = (
        "import importlib.util, sys, types\n"
        "pkg = types.ModuleType('shoal')\n"
        "pkg.__path__ = list(importlib.util.find_spec('shoal').submodule_search_locations)\n"
        "sys.modules['shoal'] = pkg\n"
        "import shoal.cli.env, shoal.env\n"
        "shoal.env.detect_environment({})\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"


def test_subprocess_json_with_faked_openmpi(shoal):
    done = shoal("env", "--json", "--device", "cpu", env=OMPI | {"MASTER_PORT": "23999"})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["scheme"], report["rank"], report["world_size"], report["main_port"]) == ("openmpi", 1, 2, 23999)


def test_subprocess_error_is_two_lines_without_traceback(shoal):
    done = shoal("env", env={"SHOAL_ENV": "nope"})
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith("shoal: error: unknown launch scheme 'nope'")
    assert lines[1].startswith("HINT: use one of: torchrun, slurm")
    assert "Traceback" not in done.stderr


def test_under_mpirun_the_job_here_is_the_mpi_job(capsys):
    """Rank 3 of 4, two ranks per node: the job is 2 nodes, not the 1 a fresh launch here would be."""
    ranks = {
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "MASTER_ADDR": "10.77.0.1",
    }
    assert run_env(["--device", "cpu"], ranks) == 0
    out = capsys.readouterr().out
    assert "node:         1 of 2" in out
    assert "openmpi started this process as rank 3 of 4: 2 process(es) on this node, 2 node(s) in all" in out
    assert "1 node(s) in all" not in out
    assert run_env(["--json", "--device", "cpu"], ranks) == 0
    job = json.loads(capsys.readouterr().out)["job"]
    assert (job["rank_of"], job["nodes"], job["nproc"], job["world_size"]) == ("openmpi", "2", 2, 4)


def test_in_a_pod_with_only_the_classic_variables(capsys):
    """Run:ai's pods (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, no PET_*): a launcher here is node
    RANK of WORLD_SIZE, so the job has WORLD_SIZE nodes (before: "1 node(s) in all")."""
    pod = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555", "RANK": "1", "WORLD_SIZE": "2"}
    assert run_env(["--device", "cpu"], pod) == 0
    out = capsys.readouterr().out
    assert "but no PET_* (Run:ai, or a training-operator before 1.7)" in out
    assert "nnodes=2, node_rank=1, master_addr=127.0.0.1, master_port=29555" in out
    assert "1 worker(s) here (2 node(s) in all)" in out


def test_in_a_batch_script_of_more_tasks_a_job_here_cannot_be_planned(capsys):
    batch = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2", "SLURM_JOB_NUM_NODES": "1", "SLURM_PROCID": "0"}
    assert run_env(["--device", "cpu"], batch) == 0
    out = capsys.readouterr().out
    assert "a job here:   cannot be planned: SLURM_NTASKS=2: this Slurm allocation asks for more" in out
    assert run_env(["--device", "cpu", "--nproc", "2"], batch) == 0
    assert "2 worker(s) here (1 node(s) in all)" in capsys.readouterr().out


def test_a_master_that_does_not_resolve_yet_is_reported_not_waited_for(capfd):
    """`shoal env` joins nothing: a pod's master name that does not resolve (yet) is one line of the
    report, without the launchers' "retrying until the join timeout"."""
    pod = {"MASTER_ADDR": "master-0.invalid", "MASTER_PORT": "29555", "RANK": "1", "WORLD_SIZE": "2"}
    assert run_env(["--device", "cpu"], pod) == 0
    captured = capfd.readouterr()
    assert "retrying" not in captured.err and "retrying" not in captured.out
    assert "master-0.invalid did not resolve on this node" in captured.out
