"""``shoal launch k8s ... -- shoal train --fault-tolerance``: the rendered lighthouse and a PyTorchJob's
two pods, run as pods (network namespaces on a bridge, tests/k8s/pod_runtime.py).

The rendered objects are admitted as Kubernetes would (the PyTorchJob against the training
operator's CRD, the Deployment and Service by tests/k8s/sim_lighthouse.py's rules); the operator
simulation (tests/k8s/sim_pytorchjob.py, kubeflow/training-operator v1.9.0) gives each pod its
variables (PET_NODE_RANK, PET_NNODES, MASTER_ADDR...); the lighthouse pod runs the Deployment's
command with ``$(POD_IP)`` resolved, reachable by the Service's name. Each pod of the job runs its
rendered command, ``shoal train digits --fault-tolerance ... --lighthouse http://ft-lighthouse:29510``:
the pod's launcher is node PET_NODE_RANK of PET_NNODES and runs that replica group.

After both groups committed, every process of the worker pod is SIGKILLed (its container dies) and
its command is started again, as the kubelet restarts a container under restartPolicy OnFailure.
The master pod's command and its group are never restarted and commit again within seconds; the
worker's group heals from it; both finish the same step with the same weights.
"""

from __future__ import annotations

import copy
import signal
import subprocess
import time

import pytest
from ft_events import SURVIVOR_COMMIT_S, events, find, metrics, show

import procs
from cluster.pods import left_behind, pods_unavailable
from k8s import sim_lighthouse, sim_pytorchjob
from k8s.crd_schema import assert_valid
from k8s.pod_runtime import container_env, run_pods
from listening import listening
from shoal.jobs.kubernetes.fault_tolerance import LIGHTHOUSE_PORT
from shoal.jobs.kubernetes.options import PodOptions, VolumeClaim
from shoal.jobs.kubernetes.pytorchjob import render_objects
from shoal.jobs.spec import JobSpec

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SHARED = "/mnt/shared"
EPOCHS = 2
BATCH = 4  # many short steps: room for a whole pod command to start again and heal before the end
TRAIN = ("shoal", "train", "digits", "--fault-tolerance", "--device", "cpu", "--epochs", str(EPOCHS),
         "--batch-size", str(BATCH), "--out", f"{SHARED}/run")  # fmt: skip


def _rendered() -> tuple[dict, dict, dict]:
    spec = JobSpec(command=TRAIN, job_name="ft", nodes=2, nproc=1, max_restarts=10)
    pods = PodOptions(image="shoal:test", namespace="team", volumes=(VolumeClaim("shared", SHARED),))
    return sim_lighthouse.split(render_objects(spec, pods))


def test_the_rendered_objects_are_admitted_and_name_each_other():
    deployment, service, job = _rendered()
    assert_valid(job)
    lighthouse = sim_lighthouse.simulate(deployment, service)
    master, worker = sim_pytorchjob.simulate(job)
    url = f"http://ft-lighthouse:{LIGHTHOUSE_PORT}"
    for pod in (master, worker):
        assert pod.argv == [*TRAIN, "--lighthouse", url], pod.argv
        assert pod.env["PET_NNODES"] == "2" and pod.restart_policy == "OnFailure"
    assert (master.env["PET_NODE_RANK"], worker.env["PET_NODE_RANK"]) == ("0", "1")  # the groups' numbers
    running = sim_lighthouse.started(lighthouse, "10.0.0.7")
    assert running.argv[:3] == ["torchft_lighthouse", "--bind", f"10.0.0.7:{LIGHTHOUSE_PORT}"]
    assert "--min_replicas" in running.argv
    # A Deployment's pods restart Always (the simulation admits no other policy, as the API server).
    bad = copy.deepcopy(deployment)
    bad["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    with pytest.raises(sim_lighthouse.SimulationError, match="restartPolicy"):
        sim_lighthouse.admit(bad, service)


@pytest.mark.timeout(600)  # three pods' imports and 360 steps across them: 1-5 min on a loaded 2-core machine
def test_a_killed_pod_costs_the_others_one_step_and_heals(tmp_path):
    reason = pods_unavailable()
    if reason:
        pytest.skip(reason)
    deployment, service, job = _rendered()
    lighthouse = sim_lighthouse.simulate(deployment, service)
    master, worker = sim_pytorchjob.simulate(job)
    shared = tmp_path / "pvc"
    shared.mkdir()
    out = shared / "run"
    logs = tmp_path / "logs"
    logs.mkdir()
    starts: dict[str, int] = {}
    running: dict[str, subprocess.Popen] = {}

    def output(pod) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(logs.glob(f"{pod.name}.*.log")))

    def details() -> str:
        return "\n".join(f"===== {p.name}\n{output(p)[-4000:]}" for p in (lighthouse, master, worker))

    with run_pods([lighthouse, master, worker], tmp_path / "pods", claims={"shared": shared}) as net:

        def start(pod) -> None:  # the kubelet starting (or restarting) the pod's container
            starts[pod.name] = starts.get(pod.name, 0) + 1
            with open(logs / f"{pod.name}.{starts[pod.name]}.log", "w") as log:
                running[pod.name] = net[pod.name].popen(
                    pod.argv, env=container_env(pod), stdout=log, stderr=subprocess.STDOUT, cwd="/"
                )

        net_addr = net[lighthouse.name].addr
        served = sim_lighthouse.started(lighthouse, net_addr)
        for pod in (served, master, worker):
            start(pod)
        procs.wait_for(
            lambda: all(find(events(out), g, "joined") for g in (0, 1)), timeout=240, what="both groups' first commit",
            unless=lambda: any(running[p.name].poll() is not None for p in (served, master, worker)), details=details,
        )  # fmt: skip
        addresses = {net[p.name].addr for p in (lighthouse, master, worker)}
        sockets = listening([pid for p in (lighthouse, master, worker) for pid in net[p.name].workload_pids()])
        victim = find(events(out), 1, "start")[0]["pid"]
        assert victim in net[worker.name].pids(), "group 1 runs in the worker pod (PET_NODE_RANK=1)"
        killed_at = time.time()
        net[worker.name].kill_processes(signal.SIGKILL)  # the container dies, every process in it
        running[worker.name].wait(timeout=30)
        start(worker)  # restartPolicy OnFailure: the kubelet runs the container's command again
        for pod in (master, worker):
            try:
                running[pod.name].wait(timeout=300)
            except subprocess.TimeoutExpired:
                pytest.fail(f"pod {pod.name} still running:\n{details()}")
        lighthouse_alive = running[lighthouse.name].poll() is None
        running[lighthouse.name].terminate()  # the Deployment's pod serves until it is deleted
        running[lighthouse.name].wait(timeout=30)
        left = left_behind([net[master.name], net[worker.name]])
    assert not left, f"processes left in pods: {left}"
    assert (running[master.name].returncode, running[worker.name].returncode) == (0, 0), details()
    assert starts == {lighthouse.name: 1, master.name: 1, worker.name: 2}, starts
    assert lighthouse_alive, details()
    url = f"http://ft-lighthouse:{LIGHTHOUSE_PORT}"
    assert f"lighthouse {url}" in output(master) and f"lighthouse {url}" in output(worker), details()
    assert "replica groups of node 1 on" in output(worker), details()
    # Every socket of the job on a pod's own address: the lighthouse, stores, manager servers, gloo.
    assert sockets and {address for address, _, _ in sockets} <= addresses, sockets
    assert _listening_on(sockets, LIGHTHOUSE_PORT) == {net_addr}, sockets  # the lighthouse: its pod's address

    found = events(out)
    # The master pod's group trains on with its one process, and commits again within seconds.
    assert len({e["pid"] for e in found if e["group"] == 0}) == 1 and len(find(found, 0, "start")) == 1, found
    after = [e for e in find(found, 0, "quorum") if e["t"] > killed_at]
    assert after and after[0]["t"] - killed_at < SURVIVOR_COMMIT_S, show(found, killed_at)
    # The worker pod's group comes back in a new process, heals from group 0 and commits.
    again = find(found, 1, "start")
    assert len(again) == 2 and again[1]["pid"] != victim, found
    assert [e for e in find(found, 1, "healed") if e["pid"] == again[1]["pid"]], show(found, killed_at)
    assert any(e["pid"] == again[1]["pid"] for e in find(found, 1, "joined")), show(found, killed_at)
    finished = {e["group"]: e for e in found if e["event"] == "finished"}
    assert finished[0]["step"] == finished[1]["step"] and finished[0]["params"] == finished[1]["params"], finished
    records = metrics(out)
    assert [r["epoch"] for r in records] == list(range(1, EPOCHS + 1)), records
    assert records[-1]["test_accuracy"] > 0.7, records


def _listening_on(sockets: set[tuple[str, int, int]], port: int) -> set[str]:
    """The addresses something listens on at ``port``."""
    return {address for address, listened, _ in sockets if listened == port}
