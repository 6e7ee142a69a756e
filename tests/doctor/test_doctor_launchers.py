"""``shoal doctor`` as one rank of a job another launcher started: real Open MPI's mpirun and a real
Slurm step (ranks join through shoal.init's TCP store, which rank 0 serves; the doctor's reports
travel through that store)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import jsonschema
import pytest

from shoal.doctor.schema import SCHEMA
from shoal.jobs.hosts.options import Here, HostsOptions, forwarded_env
from shoal.jobs.hosts.render import render_mpirun
from shoal.jobs.spec import JobSpec
from shoal.launch.ports import find_free_port

pytestmark = pytest.mark.multiprocess


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed (openmpi-bin)")
def test_under_mpirun_rank_0_prints_the_cluster_report(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OMPI_", "PMI_", "PMIX_", "SLURM_"))
        and k not in ("SHOAL_ENV", "MASTER_ADDR", "MASTER_PORT")
    }
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    command = ("shoal", "doctor", "--json", "--checkpoint-dir", str(tmp_path))
    spec = JobSpec(command=command, master_port=find_free_port(), env=forwarded_env(env))
    proc = subprocess.run(
        render_mpirun(spec, HostsOptions(np=2), Here.detect()), env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    document = json.loads(proc.stdout)  # rank 0 alone writes to stdout
    jsonschema.validate(document, SCHEMA)
    cluster = {c["name"]: c for c in document["cluster"]["checks"]}
    assert (document["mode"], document["cluster"]["scheme"], document["cluster"]["world_size"]) == (
        "cluster",
        "openmpi",
        2,
    )
    assert [node["ranks"] for node in document["nodes"]] == [[0, 1]]  # one node, both ranks
    assert {c["status"] for c in cluster.values()} == {"ok"}, cluster
    assert " MiB across 2 ranks in " in cluster["allreduce"]["summary"] and cluster["allreduce"]["data"]["seconds"] > 0
    assert cluster["storage"]["summary"].startswith(
        f"all 1 node(s) read the token rank 0 wrote to {tmp_path}/.shoal-doctor-"
    )
    assert not list(tmp_path.iterdir())


def test_under_srun_rank_0_prints_the_cluster_report(slurm, tmp_path):
    proc = subprocess.run(
        ["srun", "-n", "2", "shoal", "doctor", "--json", "--checkpoint-dir", str(tmp_path)],
        env=slurm.env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{slurm.logs()}"
    document = json.loads(proc.stdout)
    jsonschema.validate(document, SCHEMA)
    odd = [c for node in document["nodes"] for c in node["checks"] if c["status"] != "ok"]
    assert (document["cluster"]["scheme"], document["cluster"]["world_size"], odd) == ("slurm", 2, [])
