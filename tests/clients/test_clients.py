"""Scripts no one here wrote: a Hugging Face ``Trainer``, a Lightning ``Trainer(strategy="ddp")`` and an
Accelerate loop, unchanged, on every path that starts a job (issue 19, docs/CLIENTS.md):

- ``shoal run --nproc 2 SCRIPT`` on this machine;
- ``shoal launch --hosts node0:1,node1:1 --via ssh|mpirun`` from a head pod to a pod with a real sshd
  (:mod:`cluster.pods`, :mod:`cluster.sshd`): one rank per pod, the second reached over ssh;
- a PyTorchJob's two pods (rendered by shoal, the pods and their environment made by the
  training-operator simulation :mod:`k8s.sim_pytorchjob`), each running the container's command.

Each script appends one JSON line per rank (:data:`SCRIPTS`): the rank, the world size that
torch.distributed and the library each saw, the steps done, and a checksum of the trained
parameters. Every test asserts two ranks that saw world size 2, finished their steps, and ended with
the same parameters (the library's DDP kept the replicas in step while each rank read its own shard).

The libraries are a test-only install beside the venv (``make test`` runs ``make clients``:
tests/clients/requirements.txt into .venv/clients); they reach the workers through PYTHONPATH, as
any variable a user's environment needs does. Missing, every test here fails and says so.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from cluster.pods import Mount, PodSpec, left_behind, pod_network, pods_unavailable
from cluster.sshd import ssh_keypair, sshd_unavailable, start_sshd
from k8s import sim_pytorchjob
from k8s.crd_schema import assert_valid
from k8s.pod_runtime import container_env, run_pods
from procs import launcher_free_env
from shoal.jobs.kubernetes.options import PodOptions, VolumeClaim
from shoal.jobs.kubernetes.pytorchjob import render_pytorchjob
from shoal.jobs.spec import JobSpec

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

HERE = Path(__file__).parent
REQUIREMENTS = HERE / "requirements.txt"
CLIENTS = Path(sys.prefix) / "clients"
"""Where ``make clients`` installs the libraries (.venv/clients); its ``.installed`` is a copy of the list."""
SCRIPTS = {
    "hf_trainer": "transformers",
    "lightning_ddp": "lightning",
    "accelerate_loop": "accelerate",
}
"""Each client script (tests/clients/scripts/NAME.py) and the library it reports as."""
SHARED = "/mnt/shared"
HUGGING_FACE = ("transformers", "tokenizers", "safetensors", "huggingface_hub", "hf_xet", "accelerate")
"""What the Lightning scripts' workers do not see (:func:`library_path`)."""


@pytest.fixture(scope="module", autouse=True)
def clients() -> Path:
    """The test-only install, as the list says; else fail (never skip) with what to run."""
    stamp = CLIENTS / ".installed"
    if not stamp.is_file() or stamp.read_text() != REQUIREMENTS.read_text():
        pytest.fail(
            f"the client libraries of {REQUIREMENTS.relative_to(HERE.parents[1])} are not installed in {CLIENTS} "
            "(or not the listed versions): run `make test` (or `make clients`), which installs them there",
            pytrace=False,
        )
    return CLIENTS


@pytest.fixture(scope="module")
def library_path(clients, tmp_path_factory) -> Callable[[str], str]:
    """The PYTHONPATH of a script's workers: .venv/clients, or for the Lightning scripts a view of it
    without Hugging Face's libraries, as a Lightning user who never installed them has it. With them
    on the path torchmetrics (under Lightning) imports transformers' BERT scorer on every rank: 1 CPU-s
    of the 5-6 that ``import lightning`` costs here."""
    lightning_only = tmp_path_factory.mktemp("clients-lightning")
    for entry in clients.iterdir():
        if entry.name.split("-")[0] not in HUGGING_FACE:  # the package and its .dist-info
            (lightning_only / entry.name).symlink_to(entry)
    return lambda script: str(lightning_only if script.startswith("lightning") else clients)


def _env(**extra: str) -> dict[str, str]:
    """This environment without any launcher's variables, the venv's bin first on PATH."""
    return launcher_free_env(drop=("GLOO_", "NCCL_", "PYTHONPATH"), **extra)


def _script(name: str) -> str:
    return str(HERE / "scripts" / f"{name}.py")


def _assert_two_ranks_finished(results: Path, name: str, output: str) -> list[dict]:
    lines = results.read_text().splitlines() if results.exists() else []
    records = sorted((json.loads(line) for line in lines), key=lambda r: r["rank"])
    assert [r["rank"] for r in records] == [0, 1], f"expected one line from each of ranks 0 and 1:\n{output[-6000:]}"
    for r in records:
        assert r["library"] == SCRIPTS[name]
        assert (r["world_size"], r["library_world_size"]) == (2, 2), r
        assert r["library_rank"] == r["rank"], r
        assert r["finished"] is True and r["steps"] == 3, r
    assert records[0]["pid"] != records[1]["pid"]
    assert records[0]["checksum"] == pytest.approx(records[1]["checksum"], rel=1e-9, abs=1e-9), records
    return records


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_shoal_run_nproc_2(name, library_path, tmp_path):
    results = tmp_path / "results.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "shoal", "run", "--nproc", "2", _script(name), str(results), str(tmp_path / "out")],
        env=_env(PYTHONPATH=library_path(name)),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert "shoal run: 2 workers on this node" in proc.stderr
    _assert_two_ranks_finished(results, name, output)


def test_shoal_launch_localhost_2_via_mpirun(library_path, tmp_path):
    """Two ranks on one host through mpirun (each through shoal's torchrun shim: LOCAL_WORLD_SIZE 2),
    the shape the two-pod tests below do not have. (``--via ssh`` to localhost is a plain local
    ``shoal run``, no SSH: test_shoal_run_nproc_2.) One library is enough: the shape is the shim's
    (what each rank sees is the same for any script, tests/contract). The Accelerate script imports
    least (8 CPU-s, against 12 for the others), and this is its run under mpirun (ACROSS_HOSTS)."""
    name = "accelerate_loop"
    results = tmp_path / "results.jsonl"
    args = ["--hosts", "localhost:2", "--via", "mpirun", "--env", f"PYTHONPATH={library_path(name)}"]
    proc = subprocess.run(
        [sys.executable, "-m", "shoal", "launch", *args, "--", _script(name), str(results), str(tmp_path / "out")],
        env=_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert "shoal launch: mpirun, 2 processes on localhost:2" in proc.stderr, output
    _assert_two_ranks_finished(results, name, output)


def test_lightning_devices_auto_is_refused_with_its_own_message(library_path, tmp_path):
    """The caveat of docs/CLIENTS.md: devices="auto" on CPU is 1, and Lightning refuses a world of 2;
    shoal exits with the rank's status and names the failing rank with Lightning's own message."""
    proc = subprocess.run(
        [sys.executable, "-m", "shoal", "run", "--nproc", "2", _script("lightning_devices_auto")],
        env=_env(PYTHONPATH=library_path("lightning_devices_auto")),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    message = (
        "You set `devices=1` and `num_nodes=1` in Lightning, but the product (1 * 1) does not match the world size (2)."
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"shoal: error: rank 0 failed: ValueError: {message}" in proc.stderr or (
        f"shoal: error: rank 1 failed: ValueError: {message}" in proc.stderr
    ), proc.stderr[-6000:]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """node0 (the head: a key pair in /root/.ssh and known_hosts) and node1 (sshd accepting the key)."""
    reason = pods_unavailable() or sshd_unavailable()
    if reason:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("clients-ssh")
    head_ssh = base / "head-ssh"
    key = ssh_keypair(head_ssh)
    names = {"node0": "node0", "node1": "node1"}
    specs = [
        PodSpec("node0", resolves=names, mounts=[Mount("/root/.ssh", str(head_ssh))]),
        PodSpec("node1", resolves=names),
    ]
    with pod_network(specs, tag="c") as net:
        server = start_sshd(net["node1"], base / "sshd1", authorized_keys=key.authorized_keys(base / "auth1"))
        host_key = (server.config.parent / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        (head_ssh / "known_hosts").write_text(f"node1,{net['node1'].addr} {' '.join(host_key)}\n")
        yield net, server


ACROSS_HOSTS = [("hf_trainer", "mpirun"), ("lightning_ddp", "mpirun"), ("lightning_ddp", "ssh")]
"""Under mpirun each rank gets its variables from shoal's torchrun shim, beside MPI's own, which
Lightning and Accelerate also look at: Lightning's cluster plugins, and Accelerate's ``PartialState``,
which Hugging Face's ``Trainer`` sets up its process group with, so the Accelerate loop's reading of
them is the Trainer's here (and its own at two ranks under mpirun,
test_shoal_launch_localhost_2_via_mpirun). Over ssh, where each host runs a ``shoal run`` and a
script sees what it sees under test_shoal_run_nproc_2 (tests/contract), Lightning alone: of the
three it reads the most of its environment (its cluster plugins: SLURM, MPI, Kubeflow, LSF)."""


@pytest.mark.parametrize("name, via", ACROSS_HOSTS)
def test_shoal_launch_hosts(name, via, library_path, two_nodes, tmp_path):
    net, server = two_nodes
    results = tmp_path / "results.jsonl"
    args = ["--hosts", "node0:1,node1:1", "--via", via, "--env", f"PYTHONPATH={library_path(name)}"]
    proc = net["node0"].run(
        [sys.executable, "-m", "shoal", "launch", *args, "--", _script(name), str(results), str(tmp_path / "out")],
        env=_env(HOME="/root"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert {"ssh": "1 here, 1 over ssh", "mpirun": "shoal launch: mpirun, 2 processes"}[via] in proc.stderr, output
    _assert_two_ranks_finished(results, name, output)
    assert any(f"from {net['node0'].addr}" in line for line in server.accepted())  # rank 1 came over ssh
    left = left_behind(list(net), keep=[server.pid])
    assert not left, f"processes left behind: {left}"


@pytest.mark.parametrize("name", ["lightning_ddp"])
def test_pytorchjob_pods(name, library_path, tmp_path):
    """A PyTorchJob of 2 pods x 1 process: each pod runs the rendered command (``shoal run SCRIPT``),
    which reads the operator's MASTER_ADDR, RANK, PET_* and starts its worker. Lightning alone: its
    worker sees the operator's variables beside shoal run's (its Kubeflow plugin reads them); the
    other scripts read only torchrun's variables, the same as under test_shoal_run_nproc_2."""
    if reason := pods_unavailable():
        pytest.skip(reason)
    results = f"{SHARED}/results.jsonl"
    pods = PodOptions(image="shoal:test", volumes=(VolumeClaim("shared", SHARED),))
    spec = JobSpec(
        command=(_script(name), results, f"{SHARED}/out"),
        job_name=name.replace("_", "-"),
        nodes=2,
        nproc=1,
        env=(("PYTHONPATH", library_path(name)),),
    )
    manifest = render_pytorchjob(spec, pods)
    assert_valid(manifest)
    sim = sim_pytorchjob.simulate(manifest)
    assert [p.argv[:2] for p in sim] == [["shoal", "run"]] * 2, yaml.safe_dump(manifest)
    claim = tmp_path / "pvc"
    claim.mkdir()
    logs = {}
    with run_pods(sim, tmp_path / "pods", claims={"shared": claim}, tag="j") as net:
        procs = {}
        for pod in sim:
            logs[pod.name] = tmp_path / f"{pod.name}.log"
            with open(logs[pod.name], "w") as log:
                procs[pod.name] = net[pod.name].popen(
                    pod.argv, env=container_env(pod), stdout=log, stderr=subprocess.STDOUT, cwd="/"
                )
        deadline = time.monotonic() + 240
        while any(p.poll() is None for p in procs.values()) and time.monotonic() < deadline:
            time.sleep(0.2)
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        output = "\n".join(f"===== {n}\n{path.read_text(errors='replace')[-3000:]}" for n, path in logs.items())
        codes = {n: p.returncode for n, p in procs.items()}
        left = left_behind(list(net))
    assert set(codes.values()) == {0}, f"{codes}\n{output}"
    records = _assert_two_ranks_finished(claim / "results.jsonl", name, output)
    assert not left, f"processes left in pods: {left}"
    assert len(records) == 2
