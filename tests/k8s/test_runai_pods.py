"""Run:ai distributed PyTorch pods, end to end: the ``runai`` command shoal renders, the pods it makes
(:mod:`k8s.sim_runai`: a PyTorchJob of the training operator before 1.7 plus Run:ai's own variables,
as run-ai/docs documents them), real processes in network namespaces as pods.

The pods carry MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE (= pods) and no PET_* variable. Before
shoal read them, ``shoal run SCRIPT`` started a standalone one-process job on a free port in every
pod: each pod trained alone and exited 0. Here every pod's launcher is node RANK of WORLD_SIZE, the
workers meet as one job, and torchrun's contract holds on each of them.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cluster.pods import left_behind, pods_unavailable
from contract.torchrun import SCRIPT, check_report, report_from_file
from k8s import sim_runai
from k8s.pod_runtime import container_env, run_pods
from k8s.test_job_pods import Job, _show
from shoal.jobs.kubernetes.options import PodOptions, VolumeClaim
from shoal.jobs.kubernetes.runai import render_runai
from shoal.jobs.spec import JobSpec

pytestmark = pytest.mark.multiprocess
SHARED = "/mnt/shared"


@pytest.fixture(autouse=True)
def _can_make_pods():
    reason = pods_unavailable()
    if reason:
        pytest.skip(reason)


def _submit(command: tuple[str, ...], cli: str = "submit-dist") -> list[str]:
    pods = PodOptions(image="shoal:test", volumes=(VolumeClaim("shared", SHARED),))
    spec = JobSpec(command=command, job_name="dist-train1", nodes=2)
    return render_runai(spec, pods, cli, project="team-a")


def _run_job(tmp_path: Path, pods, *, after=None, timeout: float = 300):
    """Start every pod's command as the pod says, wait for all; ``after(net)`` runs in the pods' network."""
    shared = tmp_path / "pvc"
    shared.mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    extra = None
    with run_pods(pods, tmp_path / "pods", claims={"shared": shared}) as net:
        job = Job(pods, net, logs)
        for pod in pods:
            job.start(pod.name)
        codes = job.wait(timeout)
        outputs = {name: job.output(name) for name in job.pods}
        if after is not None:
            extra = after(net)
        left = left_behind([net[pod.name] for pod in pods])
    assert not left, f"processes left in pods: {left}"
    return codes, outputs, shared, extra


def test_runai_pods_carry_only_the_classic_variables():
    pods = sim_runai.simulate(_submit(("train.py",)))
    assert [p.name for p in pods] == ["dist-train1-master-0", "dist-train1-worker-0"]
    for index, pod in enumerate(pods):
        assert not [name for name in pod.env if name.startswith("PET_")]
        assert (pod.env["RANK"], pod.env["WORLD_SIZE"]) == (str(index), "2")
        assert (pod.env["MASTER_ADDR"], pod.env["MASTER_PORT"]) == ("dist-train1-master-0", "23456")
        assert (pod.env["JOB_NAME"], pod.env["POD_INDEX"]) == ("dist-train1", str(index))
        assert pod.argv == ["shoal", "run", "train.py"] and pod.namespace == "runai-team-a"


def test_shoal_run_of_a_torchrun_script_is_one_job_across_the_pods(tmp_path):
    """The rendered pod command, ``shoal run SCRIPT``: one job of 2 ranks (the contract script's
    report from rank 0 lists both; two standalone jobs would each report a world of 1), and
    ``shoal env`` in the worker pod says where a launcher there belongs."""
    pods = sim_runai.simulate(_submit((str(SCRIPT), f"{SHARED}/report.json")))
    worker = pods[1]

    def shoal_env(net):
        master_address = net[pods[0].name].addr
        return master_address, net[worker.name].run(
            ["shoal", "env", "--device", "cpu", "--json"],
            env=container_env(worker),
            capture_output=True,
            text=True,
            timeout=120,
        )

    codes, outputs, shared, (master_address, env_done) = _run_job(tmp_path, pods, after=shoal_env)
    assert set(codes.values()) == {0}, _show(outputs)
    ranks = check_report(report_from_file(shared / "report.json"), world=2, nodes=2)
    assert {v["MASTER_ADDR"] for v in ranks} == {master_address}  # the master pod's, as its name resolves
    assert [v["GROUP_RANK"] for v in ranks] == ["0", "1"] and {v["LOCAL_RANK"] for v in ranks} == {"0"}
    for index, pod in enumerate(pods):
        assert f"shoal run: this pod is node {index} of 2, read from RANK={index}, WORLD_SIZE=2" in outputs[pod.name]
    assert env_done.returncode == 0, env_done.stderr
    job = json.loads(env_done.stdout)["job"]
    assert (job["pod_variables"], job["nodes"], job["nproc"]) == ("classic", "2", 1)
    assert job["from_pod"]["node_rank"] == 1 and job["from_pod"]["master_addr"] == "dist-train1-master-0"


def test_shoal_train_as_the_pod_command_trains_on_both_pods(tmp_path):
    command = ("shoal", "train", "digits", "--epochs", "1", "--device", "cpu", "--out", f"{SHARED}/run")
    pods = sim_runai.simulate(_submit(command, cli="training"))
    assert pods[0].argv == list(command)
    codes, outputs, shared, _ = _run_job(tmp_path, pods)
    assert set(codes.values()) == {0}, _show(outputs)
    config = json.loads((shared / "run" / "config.json").read_text())
    facts = {**config, **config["extra"]}
    assert (facts["world_size"], facts["num_nodes"]) == (2, 2)
    assert facts["launch"]["nnodes"] == "2" and facts["launch"]["master_addr"] == "dist-train1-master-0"
    assert len((shared / "run" / "metrics.jsonl").read_text().splitlines()) == 1  # one job, one epoch
    assert all("shoal: this pod is node" in text for text in outputs.values()), _show(outputs)


def test_an_inconsistent_pod_stops_with_one_line_and_a_hint(tmp_path):
    """RANK beyond WORLD_SIZE (a stale export in the image, say): no job at all, one line + HINT."""
    pods = sim_runai.simulate(_submit(("train.py",)))
    pod = pods[1]
    pod.env["RANK"] = "2"
    (tmp_path / "pvc").mkdir()
    with run_pods([pod], tmp_path / "pods", claims={"shared": tmp_path / "pvc"}) as net:
        done = net[pod.name].run(
            ["shoal", "train", "digits", "--epochs", "1"],
            env=container_env(pod),
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "shoal: error: RANK=2 is not below WORLD_SIZE=2",
        "HINT: the launcher's variables disagree: each RANK must be in 0..WORLD_SIZE-1; check that no stale "
        "value is exported in your shell or job script",
    ]
