"""PyTorchJobs and a TrainJob, end to end: the manifest shoal renders, the operator's pods, real processes.

``shoal launch k8s`` renders the job; it is checked against the operator's CRD; the operator
simulations (:mod:`k8s.sim_pytorchjob`: kubeflow/training-operator v1.9.0; :mod:`k8s.sim_trainjob`:
kubeflow/trainer with the ``torch-distributed`` runtime) compute every pod's name, host name and
environment (MASTER_ADDR, RANK, WORLD_SIZE, PET_*). Each pod is a network namespace resolving the
others' names (:mod:`k8s.pod_runtime`), the claim mounted where the manifest says, and runs the
container's command exactly as the manifest says: ``shoal train digits ...``, no launch script.
shoal reads what the operator injected and starts the pod's workers itself.

What only a real cluster shows (scheduling, GPU device plugins, NCCL across pods) is out of reach
here: see docs/KUBERNETES.md.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml

from cluster.pods import left_behind, pods_unavailable
from k8s import sim_pytorchjob, sim_trainjob
from k8s.crd_schema import assert_valid
from k8s.pod_runtime import container_env, run_pods
from procs import wait_for
from shoal.jobs.kubernetes.options import PodOptions, VolumeClaim
from shoal.jobs.kubernetes.pytorchjob import render_pytorchjob
from shoal.jobs.kubernetes.trainjob import render_trainjob
from shoal.jobs.spec import JobSpec
from shoal.launch.rendezvous import RESOLVE_RETRY_S

pytestmark = pytest.mark.multiprocess
SHARED = "/mnt/shared"
RUNTIME = yaml.safe_load((Path(__file__).parent / "data" / "torch_distributed_runtime.yaml").read_text())
TRAIN = ("shoal", "train", "digits", "--device", "cpu", "--out", f"{SHARED}/run")


@pytest.fixture(autouse=True)
def _can_make_pods():
    reason = pods_unavailable()
    if reason:
        pytest.skip(reason)


def _spec(name: str, nodes: int, nproc: int | str, command=TRAIN, elastic=None) -> tuple[JobSpec, PodOptions]:
    pods = PodOptions(image="shoal:test", namespace="team", volumes=(VolumeClaim("shared", SHARED),), elastic=elastic)
    return JobSpec(command=command, job_name=name, nodes=nodes, nproc=nproc), pods


class Job:
    """The pods of one job, running: start them, restart a pod's command, wait for all."""

    def __init__(self, pods, net, logs: Path) -> None:
        self.pods, self.net, self.logs = {p.name: p for p in pods}, net, logs
        self.procs: dict[str, subprocess.Popen] = {}
        self.starts: dict[str, int] = {}

    def start(self, name: str) -> None:
        pod = self.pods[name]
        self.starts[name] = self.starts.get(name, 0) + 1
        log = open(self.logs / f"{name}.{self.starts[name]}.log", "w")  # noqa: SIM115 (the process writes it)
        self.procs[name] = self.net[name].popen(
            pod.argv, env=container_env(pod), stdout=log, stderr=subprocess.STDOUT, cwd="/"
        )

    def output(self, name: str) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.logs.glob(f"{name}.*.log")))

    def wait(self, timeout: float, restart_failed: int = 0) -> dict[str, int]:
        """Wait for every pod's command; with ``restart_failed``, start a command that failed again
        (at most that many times in all), as the kubelet does under restartPolicy OnFailure."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in list(self.procs.items()):
                if proc.poll() not in (None, 0) and restart_failed > 0:
                    restart_failed -= 1
                    self.start(name)
            if all(proc.poll() is not None for proc in self.procs.values()) and not (
                restart_failed and any(p.returncode for p in self.procs.values())
            ):
                return {name: proc.returncode for name, proc in self.procs.items()}
            time.sleep(0.2)
        raise AssertionError(
            "pods still running:\n" + "\n".join(f"== {n}\n{self.output(n)[-3000:]}" for n in self.pods)
        )


def _run(tmp_path: Path, pods, *, order=None, restart_failed=0, kill=None, timeout=300):
    shared = tmp_path / "pvc"
    shared.mkdir(exist_ok=True)
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    with run_pods(pods, tmp_path / "pods", claims={"shared": shared}) as net:
        job = Job(pods, net, logs)
        for name in [p.name for p in pods] if order is None else order:
            job.start(name)
        if kill is not None:
            kill(job, shared)
        codes = job.wait(timeout, restart_failed)
        outputs = {name: job.output(name) for name in job.pods}
        left = left_behind([net[pod.name] for pod in pods])
    assert not left, f"processes left in pods: {left}"
    return codes, outputs, shared, job.starts


def _show(outputs: dict[str, str]) -> str:
    return "\n".join(f"===== {name}\n{text[-4000:]}" for name, text in outputs.items())


def _facts(shared: Path) -> dict:
    config = json.loads((shared / "run" / "config.json").read_text())
    return {**config, **config["extra"]}


@pytest.mark.parametrize("pods, nproc", [(3, 2)])  # 2 pods x 1: the late-DNS test below
def test_pytorchjob_trains_in_every_pod_shape(tmp_path, pods, nproc):
    manifest = render_pytorchjob(*_spec(f"job{pods}x{nproc}", pods, nproc, (*TRAIN, "--epochs", "1")))
    assert_valid(manifest)
    sim = sim_pytorchjob.simulate(manifest)
    worlds = {p.env["WORLD_SIZE"] for p in sim}
    assert worlds == {str(pods * nproc)}  # training-operator >= 1.7: pods x nprocPerNode (never read by shoal)
    codes, outputs, shared, _ = _run(tmp_path, sim)
    assert set(codes.values()) == {0}, _show(outputs)
    facts = _facts(shared)
    assert facts["world_size"] == pods * nproc and facts["num_nodes"] == pods
    assert facts["launch"]["nproc"] == nproc and facts["launch"]["nnodes"] == str(pods)
    assert len((shared / "run" / "metrics.jsonl").read_text().splitlines()) == 1


def test_elastic_pytorchjob_meets_over_c10d(tmp_path):
    manifest = render_pytorchjob(*_spec("elastic", 2, 1, (*TRAIN, "--epochs", "1"), elastic=(1, 2)))
    assert_valid(manifest)
    sim = sim_pytorchjob.simulate(manifest)
    assert {p.env["PET_RDZV_BACKEND"] for p in sim} == {"c10d"} and {p.env["PET_NNODES"] for p in sim} == {"1:2"}
    codes, outputs, shared, _ = _run(tmp_path, sim)
    assert set(codes.values()) == {0}, _show(outputs)
    assert _facts(shared)["launch"]["rdzv_backend"] == "c10d"


def test_trainjob_trains_on_two_nodes(tmp_path):
    manifest = render_trainjob(*_spec("tj", 2, 1, (*TRAIN, "--epochs", "1")))
    assert_valid(manifest)
    sim = sim_trainjob.simulate(manifest, RUNTIME)
    assert all("WORLD_SIZE" not in p.env and "RANK" not in p.env for p in sim)  # Trainer v2: PET_* only
    codes, outputs, shared, _ = _run(tmp_path, sim)
    assert set(codes.values()) == {0}, _show(outputs)
    assert _facts(shared)["world_size"] == 2


def test_workers_wait_for_the_masters_name_to_resolve(tmp_path):
    """The worker pod starts first, while the master's Service name does not resolve yet (its pod
    is not scheduled): shoal retries the name, and the job completes once the master is up."""
    manifest = render_pytorchjob(*_spec("late", 2, 1, (*TRAIN, "--epochs", "1")))
    sim = sim_pytorchjob.simulate(manifest)
    master, worker = sim
    hosts = Path("/etc/netns")

    def hide_then_start_master(job: Job, shared: Path) -> None:
        ns = job.net[worker.name].netns
        hosts_file = hosts / ns / "hosts"
        full = hosts_file.read_text()
        with open(hosts_file, "w") as f:  # the same file (bind-mounted into the pod): rewritten in place
            f.write("".join(line + "\n" for line in full.splitlines() if master.name not in line))
        job.start(worker.name)
        waiting = f"shoal: {master.name} does not resolve yet on this node; retrying until the join timeout"
        # The name failed and is retried.
        wait_for(lambda: waiting in job.output(worker.name), 120, 0.1, waiting, details=lambda: job.output(worker.name))
        time.sleep(2 * RESOLVE_RETRY_S)  # a retry or two later: still waiting, not failed
        assert job.procs[worker.name].poll() is None, job.output(worker.name)
        with open(hosts_file, "w") as f:
            f.write(full)
        job.start(master.name)

    codes, outputs, shared, _ = _run(tmp_path, sim, order=[], kill=hide_then_start_master)
    assert set(codes.values()) == {0}, _show(outputs)
    facts = _facts(shared)  # the 2-pod, 1-process-per-pod shape of a PyTorchJob, to completion
    assert (facts["world_size"], facts["num_nodes"], facts["launch"]["nproc"]) == (2, 2, 1)
    assert {p.env["WORLD_SIZE"] for p in sim} == {"2"}


def test_a_pod_killed_mid_run_restarts_and_resumes_bit_identical(tmp_path):
    """restartPolicy OnFailure: a worker pod's process is killed after a checkpoint; the pods whose
    command failed start again (the kubelet's part, done by the test) and resume from the claim."""
    command = (*TRAIN, "--epochs", "2", "--checkpoint-every", "10steps")
    reference = tmp_path / "reference"
    reference.mkdir()
    sim = sim_pytorchjob.simulate(render_pytorchjob(*_spec("once", 2, 1, command)))
    codes, outputs, shared, _ = _run(reference, sim)
    assert set(codes.values()) == {0}, _show(outputs)
    expected = torch.load(shared / "run" / "model.pt", weights_only=True)

    def kill_worker(job: Job, shared: Path) -> None:
        wait_for(lambda: len(list((shared / "run" / "checkpoints").glob("ckpt-*.pt"))) >= 2, 240, 0.1, "2 checkpoints")
        worker = next(name for name in job.pods if "worker" in name)
        for pid in job.net[worker].workload_pids():
            try:
                Path(f"/proc/{pid}/stat").read_text()
                import os

                os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass

    crashed = tmp_path / "crashed"
    crashed.mkdir()
    sim = sim_pytorchjob.simulate(render_pytorchjob(*_spec("crash", 2, 1, command)))
    codes, outputs, shared, starts = _run(crashed, sim, kill=kill_worker, restart_failed=4)
    assert set(codes.values()) == {0}, _show(outputs)
    assert max(starts.values()) >= 2, starts  # a pod's command really ran again
    assert any("resuming from" in text for text in outputs.values()), outputs
    resumed = torch.load(shared / "run" / "model.pt", weights_only=True)
    assert resumed.keys() == expected.keys() and all(torch.equal(resumed[k], expected[k]) for k in expected)


def test_the_launch_script_pitfall_that_shoals_pod_command_avoids(tmp_path):
    """The tutorial's launch.sh: ``torchrun --nnodes=$WORLD_SIZE``. With nprocPerNode 2 the operator
    sets WORLD_SIZE to pods x 2, so torchrun waits for four nodes that never come (here bounded by a
    3 s join timeout: any wait proves it, and both pods, started together, arrive well within it).
    shoal's own pod command reads PET_NNODES and trains (the shapes above)."""
    script = (
        "exec torchrun --nnodes=$WORLD_SIZE --nproc-per-node=$PET_NPROC_PER_NODE --rdzv_backend=c10d "
        "--rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT --rdzv_conf=join_timeout=3 -m shoal train digits --epochs 1"
    )
    manifest = render_pytorchjob(*_spec("launchsh", 2, 2, TRAIN))
    for replica in manifest["spec"]["pytorchReplicaSpecs"].values():  # the tutorial's container command
        container = replica["template"]["spec"]["containers"][0]
        container["command"], container["args"] = ["sh", "-c", script], []
    assert_valid(manifest)
    sim = sim_pytorchjob.simulate(manifest)
    assert {p.env["WORLD_SIZE"] for p in sim} == {"4"} and {p.env["PET_NNODES"] for p in sim} == {"2"}
    codes, outputs, _, _ = _run(tmp_path, sim, timeout=240)
    assert all(code != 0 for code in codes.values()), outputs
    assert any("RendezvousTimeoutError" in text or "timed out" in text.lower() for text in outputs.values()), outputs


# ---- the torchrun contract (docs/LAUNCHERS.md): an unchanged torchrun-style script as the pod command ----


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_a_torchrun_script_sees_torchruns_contract_in_operator_pods(tmp_path, kind):
    """The pod command shoal renders for a user's script (`shoal run SCRIPT`) in 2 pods x 2 processes."""
    from contract.torchrun import SCRIPT, check_report, report_from_file

    spec = _spec(f"contract-{kind}", 2, 2, (str(SCRIPT), f"{SHARED}/contract.json"))
    if kind == "pytorchjob":
        manifest = render_pytorchjob(*spec)
        sim = sim_pytorchjob.simulate(manifest)
    else:
        manifest = render_trainjob(*spec)
        sim = sim_trainjob.simulate(manifest, RUNTIME)
    assert_valid(manifest)
    codes, outputs, shared, _ = _run(tmp_path, sim)
    assert set(codes.values()) == {0}, _show(outputs)
    ranks = check_report(report_from_file(shared / "contract.json"), world=4, nodes=2)
    assert [(v["GROUP_RANK"], v["LOCAL_RANK"]) for v in ranks] == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
    assert {v["LOCAL_WORLD_SIZE"] for v in ranks} == {"2"}
