"""Kubernetes, Run:ai and image renderers pinned by golden files, and ``shoal launch k8s|runai|image``.

Each case renders one job; its text must equal ``golden/k8s/<case>``. After an intended change,
regenerate and review the diff::

    SHOAL_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/jobs/test_render_k8s.py
    git diff tests/jobs/golden/k8s/

The manifests' validity against the operators' CRD schemas, and what the operators make of them,
is tested in ``tests/k8s/``. Everything here runs in-process; kubectl runs for real (there is no
cluster, so applying fails, and must fail clearly).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest
import yaml

from shoal.cli import launch as launch_cli
from shoal.errors import ShoalError
from shoal.jobs.kubernetes import trainjob
from shoal.jobs.kubernetes.image import render_dockerfile, render_dockerignore
from shoal.jobs.kubernetes.manifest import MANIFEST_MARKER, to_yaml, to_yaml_all
from shoal.jobs.kubernetes.mpijob import render_mpijob
from shoal.jobs.kubernetes.options import PodOptions, SecretEnv, VolumeClaim, grace_period
from shoal.jobs.kubernetes.pytorchjob import render_objects, render_pytorchjob
from shoal.jobs.kubernetes.runai import RUNAI_CLIS, render_runai
from shoal.jobs.kubernetes.trainjob import render_trainjob
from shoal.jobs.spec import JobSpec

GOLDEN = Path(__file__).parent / "golden" / "k8s"
IMAGE = "ghcr.io/example/train:1.0"
GPU_PODS = PodOptions(
    image=IMAGE,
    namespace="ml",
    cpu="8",
    memory="64Gi",
    volumes=(VolumeClaim("shared-data", "/data", read_only=True), VolumeClaim("checkpoints", "/ckpt")),
    secret_env=(SecretEnv("WANDB_API_KEY", "wandb", "api-key"),),
    shm_size="16Gi",
)
GPU_TRAIN = ("shoal", "train", "cifar10", "--data", "/data", "--out", "/ckpt/run", "--preempt-grace", "60")


def _gpu_job(**kw) -> tuple[JobSpec, PodOptions]:
    return (
        JobSpec(
            command=GPU_TRAIN,
            job_name="cifar",
            nodes=3,
            nproc=4,
            gpus_per_node=4,
            env=(("NCCL_DEBUG", "INFO"),),
            max_restarts=2,
            **kw,
        ),
        GPU_PODS,
    )


CPU_PODS = PodOptions(image=IMAGE, cpu="2", memory="4Gi", volumes=(VolumeClaim("shared", "/shared"),))
CASES = {
    "pytorchjob_gpu.yaml": lambda: to_yaml(render_pytorchjob(*_gpu_job())),
    "pytorchjob_cpu_auto.yaml": lambda: to_yaml(
        render_pytorchjob(
            JobSpec(
                command=("shoal", "train", "digits", "--device", "cpu", "--out", "/shared/run"),
                job_name="digits",
                nodes=2,
                nproc="auto",
            ),
            CPU_PODS,
        )
    ),
    "pytorchjob_elastic.yaml": lambda: to_yaml(
        render_pytorchjob(
            JobSpec(
                command=("train.py", "--epochs", "10"),
                job_name="elastic",
                nodes=2,
                nproc=1,
                max_restarts=3,
            ),
            PodOptions(image=IMAGE, elastic=(1, 4), grace_period_s=120),
        )
    ),
    # Three documents (what --dry-run prints): the lighthouse's Deployment and Service, then the job.
    "pytorchjob_fault_tolerance.txt": lambda: to_yaml_all(render_objects(_ft_job(), CPU_PODS)),
    # The same lighthouse, then a TrainJob whose pods restart as its runtime says (trainjob.py).
    "trainjob_fault_tolerance.txt": lambda: to_yaml_all(trainjob.render_objects(_ft_job(max_restarts=0), CPU_PODS)),
    "trainjob.yaml": lambda: to_yaml(render_trainjob(JobSpec(**_trainjob_kwargs()), GPU_PODS)),
    "trainjob_cpu_module.yaml": lambda: to_yaml(
        render_trainjob(JobSpec(command=("-m", "mypkg.train", "--lr", "0.1"), job_name="mod", nodes=2), CPU_PODS)
    ),
    "mpijob.yaml": lambda: to_yaml(render_mpijob(*_gpu_job())),
    "mpijob_cpu_script.yaml": lambda: to_yaml(
        render_mpijob(
            JobSpec(
                command=("python", "hvd_train.py", "--epochs", "2"),
                job_name="hvd",
                nodes=2,
                nproc=2,
                env=(("OMP_NUM_THREADS", "1"),),
            ),
            CPU_PODS,
        )
    ),
    "runai.txt": lambda: "\n".join(
        shlex.join(render_runai(*_runai_job(), cli, project="team-a")) for cli in RUNAI_CLIS
    ),
    "Dockerfile": lambda: render_dockerfile(
        JobSpec(command=("train.py", "--lr", "0.1")), shoal_requirement="shoal==0.1.0", requirements="requirements.txt"
    ),
    "Dockerfile.mpi": lambda: render_dockerfile(JobSpec(command=GPU_TRAIN), shoal_requirement="shoal==0.1.0", mpi=True),
    # A fault-tolerant command: every pod needs torchft, shoal's [ft] extra.
    "Dockerfile.ft": lambda: render_dockerfile(JobSpec(command=FT_TRAIN), shoal_requirement="shoal==0.1.0"),
    "dockerignore": render_dockerignore,
}


FT_TRAIN = ("shoal", "train", "digits", "--fault-tolerance", "--device", "cpu", "--out", "/shared/run")


def _ft_job(command=FT_TRAIN, max_restarts=10) -> JobSpec:
    return JobSpec(command=command, job_name="digits-ft", nodes=3, nproc=1, max_restarts=max_restarts)


def _trainjob_kwargs() -> dict:
    return dict(
        command=GPU_TRAIN,
        job_name="cifar",
        nodes=3,
        nproc="auto",
        gpus_per_node=4,
        env=(("NCCL_DEBUG", "INFO"),),
    )


def _runai_job() -> tuple[JobSpec, PodOptions]:
    return (
        JobSpec(
            command=("train.py", "--epochs", "10", "--checkpoint-every", "2"),
            job_name="distributed-training-pytorch",
            nodes=2,
            nproc=1,
            gpus_per_node=1,
            env=(("NCCL_DEBUG", "INFO"),),
        ),
        PodOptions(image="docker.io/me/distributed_training_pytorch", volumes=(VolumeClaim("ckpt", "/ckpt"),)),
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case):
    text = CASES[case]().rstrip("\n") + "\n"
    path = GOLDEN / case
    if os.environ.get("SHOAL_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: regenerate with SHOAL_UPDATE_GOLDEN=1 (see the module docstring)"
    assert text == path.read_text(), f"{case} differs from {path}: review, then regenerate if intended"


def test_no_golden_file_is_stale():
    assert sorted(p.name for p in GOLDEN.iterdir()) == sorted(CASES)


# ---- what the renderings must say (independent of the golden text) -------------------------------


def test_pytorchjob_master_and_workers_share_the_pod():
    job = render_pytorchjob(*_gpu_job())
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 2)
    assert replicas["Master"]["template"] == replicas["Worker"]["template"]
    assert replicas["Master"]["template"] is not replicas["Worker"]["template"]  # no YAML anchors
    assert "&id" not in to_yaml(job)
    pod = replicas["Master"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["name"] == "pytorch" and container["command"] == list(GPU_TRAIN)  # no launch script
    assert container["ports"] == [{"name": "pytorchjob-port", "containerPort": 29500}]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert pod["terminationGracePeriodSeconds"] == 65  # --preempt-grace 60 + 5
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in pod["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert job["spec"]["nprocPerNode"] == "4" and job["spec"]["runPolicy"]["backoffLimit"] == 2


def test_elastic_pytorchjob_has_workers_only_and_an_elastic_policy():
    job = render_pytorchjob(
        JobSpec(command=("shoal", "train"), job_name="e", nodes=3), PodOptions(image=IMAGE, elastic=(2, 4))
    )
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Worker"]
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    assert job["spec"]["elasticPolicy"] == {
        "minReplicas": 2,
        "maxReplicas": 4,
        "rdzvBackend": "c10d",
        "rdzvId": "e",
        "maxRestarts": 0,
    }


def test_trainjob_resolves_auto_as_shoal_means_it():
    """Trainer's own auto counts CPUs on CPU pods: shoal renders the number it means."""
    cpu = render_trainjob(JobSpec(command=("train.py",), nodes=2, nproc="auto"), CPU_PODS)
    gpu = render_trainjob(JobSpec(command=("train.py",), nodes=2, gpus_per_node=8, nproc="auto"), CPU_PODS)
    assert cpu["spec"]["trainer"]["numProcPerNode"] == 1 and gpu["spec"]["trainer"]["numProcPerNode"] == 8
    assert cpu["spec"]["trainer"]["command"] == ["shoal", "run", "train.py"]
    assert cpu["spec"]["runtimeRef"]["name"] == "torch-distributed"


def test_mpijob_launcher_runs_the_tutorial_mpirun_against_the_operator_hostfile():
    job = render_mpijob(*_gpu_job())
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    command = shlex.join(launcher["command"])
    for flags in (
        "mpirun -np 12 --allow-run-as-root",
        "-bind-to none -map-by slot",
        "-mca pml ob1 -mca btl '^openib'",
        "-x NCCL_DEBUG -x LD_LIBRARY_PATH -x PATH",
        "-x MASTER_ADDR=cifar-worker-0.cifar.ml.svc -x MASTER_PORT=29500",
        "-x WANDB_API_KEY",  # the secret reaches the ranks by name, never by value
    ):
        assert flags in command
    assert "-H" not in launcher["command"] and "--hostfile" not in launcher["command"]
    assert command.endswith(shlex.join(GPU_TRAIN))
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 3 and worker["template"]["spec"]["containers"][0]["command"] == [
        "/usr/sbin/sshd",
        "-De",
    ]
    assert job["spec"]["slotsPerWorker"] == 4 and job["spec"]["sshAuthMountPath"] == "/root/.ssh"


def test_runai_workers_count_the_pods_beside_the_master():
    for cli in RUNAI_CLIS:
        argv = render_runai(*_runai_job(), cli)
        assert argv[argv.index("--workers") + 1] == "1"  # 2 pods: the master and one worker
        assert argv[argv.index("--command") + 1 :] == [
            "--",
            "shoal",
            "run",
            "train.py",
            "--epochs",
            "10",
            "--checkpoint-every",
            "2",
        ]
    four = (JobSpec(command=("train.py",), nodes=2, nproc=4, gpus_per_node=4), PodOptions(image=IMAGE))
    assert render_runai(*four, "submit-dist")[-5:] == ["shoal", "run", "--nproc-per-node", "4", "train.py"]


def test_secret_values_never_reach_a_rendering():
    value = "s3cr3t-value-that-must-not-leak"
    with pytest.raises(ShoalError) as err:
        render_pytorchjob(JobSpec(command=("train.py",), env=(("HF_TOKEN", value),)), PodOptions(image=IMAGE))
    assert value not in err.value.message + err.value.hint and "--secret-env HF_TOKEN=" in err.value.hint


@pytest.mark.parametrize(
    "command, explicit, expected",
    [
        (("shoal", "train", "digits"), None, 30),
        (("shoal", "train", "--preempt-grace=12.5"), None, 18),
        (("python", "-m", "shoal", "train", "--preempt-grace", "100"), None, 105),
        (("shoal", "train"), 300, 300),
        (("train.py",), None, 30),
        (("train.py",), 7, 7),
    ],
)
def test_grace_period_covers_the_preemption_checkpoint(command, explicit, expected):
    assert grace_period(command, explicit) == expected


def test_a_grace_period_shorter_than_the_checkpoint_is_refused():
    with pytest.raises(ShoalError, match="shorter than the command's --preempt-grace 25 s") as err:
        grace_period(("shoal", "train"), 10)
    assert "--grace-period 30" in err.value.hint


def test_a_fault_tolerant_pytorchjob_names_the_lighthouse_rendered_beside_it():
    deployment, service, job = render_objects(_ft_job(), CPU_PODS)
    assert (deployment["kind"], service["kind"], job["kind"]) == ("Deployment", "Service", "PyTorchJob")
    assert deployment["metadata"]["name"] == service["metadata"]["name"] == "digits-ft-lighthouse"
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    (lighthouse,) = deployment["spec"]["template"]["spec"]["containers"]
    assert lighthouse["command"][:3] == ["torchft_lighthouse", "--bind", "$(POD_IP):29510"]  # never [::]
    assert lighthouse["env"][0] == {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        command = replica["template"]["spec"]["containers"][0]["command"]
        assert command == [*FT_TRAIN, "--lighthouse", "http://digits-ft-lighthouse:29510"]
    assert "&id" not in to_yaml_all([deployment, service, job])


def test_a_fault_tolerant_trainjob_names_the_same_lighthouse_and_no_job_alone_names_one_unrendered():
    *pytorch_lighthouse, _ = render_objects(_ft_job(), CPU_PODS)
    *lighthouse, job = trainjob.render_objects(_ft_job(max_restarts=0), CPU_PODS)
    assert lighthouse == pytorch_lighthouse  # one piece, whichever kind runs the pods
    assert job["spec"]["trainer"]["command"] == [*FT_TRAIN, "--lighthouse", "http://digits-ft-lighthouse:29510"]
    # The single-object renderers cannot hand out pods that name a lighthouse nobody applies.
    for alone in (
        lambda: render_pytorchjob(_ft_job(), CPU_PODS),
        lambda: render_trainjob(_ft_job(max_restarts=0), CPU_PODS),
    ):
        with pytest.raises(ShoalError, match="name the lighthouse rendered beside it") as err:
            alone()
        assert "render_objects" in err.value.hint
    own = (*FT_TRAIN, "--lighthouse", "http://lh.infra:29510")
    assert render_trainjob(_ft_job(own, 0), CPU_PODS)["spec"]["trainer"]["command"] == list(own)


def test_the_rendered_lighthouse_has_the_settings_of_the_one_shoal_runs_itself():
    from shoal.jobs.kubernetes.fault_tolerance import lighthouse_command
    from shoal.train.ft.lighthouse import Lighthouse

    served = Lighthouse("127.0.0.1", 29510).command()
    rendered = lighthouse_command()
    assert rendered[0] == "torchft_lighthouse" and served[1].endswith("lighthouse_main.py")
    assert rendered[1:] == [arg.replace("127.0.0.1", "$(POD_IP)") for arg in served[2:]]


def test_a_fault_tolerant_command_with_its_own_lighthouse_renders_the_job_alone():
    own = (*FT_TRAIN, "--lighthouse", "http://lh.infra:29510")
    (job,) = render_objects(_ft_job(own), CPU_PODS)
    assert job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"] == list(own)


# ---- the CLI -------------------------------------------------------------------------------------


def _cli(capsys, *argv) -> str:
    assert launch_cli.main_raw(list(argv)) == 0
    return capsys.readouterr().out


def test_cli_k8s_dry_run_prints_yaml_for_each_kind(capsys):
    for kind in ("pytorchjob", "trainjob", "mpijob"):
        out = _cli(capsys, "k8s", "--kind", kind, "--image", IMAGE, "--nodes", "2", "--dry-run", "--", "shoal", "train")
        assert out.startswith(MANIFEST_MARKER)
        assert yaml.safe_load(out)["kind"].lower() == kind


def test_cli_k8s_fault_tolerance_prints_three_objects_and_restarts_pods_by_default(capsys):
    argv = ["k8s", "--image", IMAGE, "--nodes", "2", "--volume", "shared:/shared", "--dry-run", "--", *FT_TRAIN]
    out = _cli(capsys, *argv)
    assert out.startswith(MANIFEST_MARKER)
    objects = list(yaml.safe_load_all(out))
    assert [o["kind"] for o in objects] == ["Deployment", "Service", "PyTorchJob"]
    assert objects[-1]["spec"]["runPolicy"]["backoffLimit"] == 10  # a lost group comes back as a restarted pod
    plain = yaml.safe_load(_cli(capsys, "k8s", "--image", IMAGE, "--nodes", "2", "--dry-run", "--", "shoal", "train"))
    assert plain["spec"]["runPolicy"]["backoffLimit"] == 0
    objects = list(yaml.safe_load_all(_cli(capsys, "k8s", "--kind", "trainjob", *argv[1:])))
    assert [o["kind"] for o in objects] == ["Deployment", "Service", "TrainJob"]  # no --max-restarts to refuse


def test_cli_k8s_env_without_value_comes_from_this_shell(capsys, monkeypatch):
    monkeypatch.setenv("MY_SETTING", "from-shell")
    out = _cli(capsys, "k8s", "--image", IMAGE, "--env", "MY_SETTING", "--dry-run", "--", "train.py")
    env = yaml.safe_load(out)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"]
    assert env == [{"name": "MY_SETTING", "value": "from-shell"}]


def test_cli_k8s_applies_with_kubectl_and_reports_its_failure(tmp_path, monkeypatch):
    """kubectl is installed here but no cluster exists: the real kubectl fails, shoal says why."""
    if not __import__("shutil").which("kubectl"):
        pytest.skip("kubectl is not installed (scripts/install-system-deps.sh installs it)")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    with pytest.raises(ShoalError, match="kubectl apply of PyTorchJob digits failed: no Kubernetes API server") as err:
        launch_cli.main_raw(["k8s", "--name", "digits", "--image", IMAGE, "--", "shoal", "train"])
    assert "--dry-run" in err.value.hint and "\n" not in err.value.message
    assert list(tmp_path.iterdir()) == [], "nothing is written when kubectl applies"


def test_cli_k8s_without_kubectl_writes_the_file_and_prints_the_command(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no kubectl
    out = _cli(capsys, "k8s", "--name", "digits", "--image", IMAGE, "--", "shoal", "train")
    assert out.strip() == "kubectl apply -f digits.yaml"
    written = (tmp_path / "digits.yaml").read_text()
    assert yaml.safe_load(written)["kind"] == "PyTorchJob" and written.startswith(MANIFEST_MARKER)
    (tmp_path / "mine.yaml").write_text("kind: Mine\n")
    with pytest.raises(ShoalError, match="mine.yaml exists and was not written by shoal"):
        launch_cli.main_raw(["k8s", "--image", IMAGE, "--file", "mine.yaml", "--", "shoal", "train"])
    assert (tmp_path / "mine.yaml").read_text() == "kind: Mine\n"


def test_cli_runai_prints_every_generation_or_one(capsys):
    out = _cli(capsys, "runai", "--image", IMAGE, "-g", "1", "--", "train.py")
    lines = out.splitlines()
    assert [line for line in lines if line.startswith("#")] == [
        "# Run:ai CLI v1 before 2.13:",
        "# Run:ai CLI v1, 2.13 and later:",
        "# Run:ai CLI v2 (clusters 2.18 and later):",
    ]
    assert lines[1].startswith("runai submit-pytorch --name shoal -i")
    assert lines[3].startswith("runai submit-dist pytorch --name shoal -i")
    assert lines[5].startswith("runai training pytorch submit shoal -i")
    out = _cli(capsys, "runai", "--cli", "submit-dist", "--image", IMAGE, "--", "train.py")
    assert out.count("\n") == 1 and out.startswith("runai submit-dist pytorch")


def test_cli_image_writes_both_files_and_never_a_foreign_one(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    out = _cli(capsys, "image", "--image", "me/train:1", "--", "train.py", "--lr", "0.1")
    assert out.strip() == "docker build -t me/train:1 . && docker push me/train:1"
    dockerfile = (tmp_path / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["shoal"]' in dockerfile and 'CMD ["run", "train.py", "--lr", "0.1"]' in dockerfile
    assert ".venv" in (tmp_path / ".dockerignore").read_text().splitlines()
    _cli(capsys, "image", "--mpi", "--", "train.py")  # its own files: replaced
    assert "openssh-server" in (tmp_path / "Dockerfile").read_text()
    (tmp_path / ".dockerignore").write_text("mine\n")
    with pytest.raises(ShoalError, match=".dockerignore exists and was not written by shoal"):
        launch_cli.main_raw(["image", "--", "train.py", "--lr", "1"])
    assert "openssh-server" in (tmp_path / "Dockerfile").read_text(), "neither file written when one is foreign"


BAD_INPUT = [
    (["k8s", "--name", "Digits", "--image", IMAGE, "--", "shoal", "train"], "is not a DNS-1035 label"),
    (["k8s", "--name", "9lives", "--image", IMAGE, "--", "shoal", "train"], "is not a DNS-1035 label"),
    (["k8s", "--name", "a" * 64, "--image", IMAGE, "--", "shoal", "train"], "is not a DNS-1035 label"),
    (["k8s", "--name", "a" * 55, "--nodes", "20", "--image", IMAGE, "--", "x.py"], "is too long: the operator names"),
    (["k8s", "--kind", "mpijob", "--name", "a" * 55, "--nodes", "10", "--image", IMAGE, "--", "x.py"], "too long"),
    (["k8s", "--", "shoal", "train"], "no image given"),
    (["k8s", "--kind", "trainjob", "--", "shoal", "train"], "no image given"),
    (["runai", "--", "train.py"], "no image given"),
    (["k8s", "--image", IMAGE, "--nodes", "0", "--", "shoal", "train"], "nodes must be at least 1"),
    (
        ["k8s", "--image", IMAGE, "--nproc-per-node", "two", "--", "x.py"],
        "neither a whole number of at least 1 nor auto",
    ),
    (["k8s", "--image", IMAGE, "--nproc-per-node", "0", "--", "x.py"], "neither a whole number"),
    (["k8s", "--image", IMAGE, "-g", "2", "--", "shoal", "train", "--device", "cpu"], "trains with --device cpu"),
    (["runai", "--image", IMAGE, "-g", "2", "--", "shoal", "train", "--device=cpu"], "trains with --device cpu"),
    (["k8s", "--image", IMAGE, "--", "shoal", "train", "--device", "cuda"], "no GPU is requested"),
    (["k8s", "--image", IMAGE, "--env", "HF_TOKEN=hf_abc123", "--", "x.py"], "looks like a secret"),
    (["k8s", "--image", IMAGE, "--env", "DB_PASSWORD=pw", "--", "x.py"], "looks like a secret"),
    (["k8s", "--image", IMAGE, "--env", "AWS_SECRET_ACCESS_KEY=k", "--", "x.py"], "looks like a secret"),
    (["runai", "--image", IMAGE, "--env", "API_KEY=k", "--", "x.py"], "looks like a secret"),
    (["k8s", "--image", IMAGE, "--secret-env", "TOKEN=nocolon", "--", "x.py"], "is malformed"),
    (["k8s", "--image", IMAGE, "--secret-env", "TOKEN=Bad_Name:key", "--", "x.py"], "is not a secret name"),
    (["k8s", "--image", IMAGE, "--volume", "data", "--", "x.py"], "is malformed"),
    (["k8s", "--image", IMAGE, "--volume", "data:relative", "--", "x.py"], "must be absolute"),
    (["k8s", "--image", IMAGE, "--cpu", "lots", "--", "x.py"], "not a positive Kubernetes quantity"),
    (["k8s", "--image", IMAGE, "--memory", "0", "--", "x.py"], "not a positive Kubernetes quantity"),
    (["k8s", "--image", IMAGE, "--namespace", "My_NS", "--", "x.py"], "not a Kubernetes namespace name"),
    (["k8s", "--image", IMAGE, "--nodes", "5", "--elastic", "1:4", "--", "x.py"], "outside --elastic 1:4"),
    (["k8s", "--image", IMAGE, "--elastic", "4:2", "--nodes", "3", "--", "x.py"], "need 1 <= MIN <= MAX"),
    (["k8s", "--kind", "mpijob", "--image", IMAGE, "--elastic", "1:2", "--", "x.py"], "only a PyTorchJob is elastic"),
    (["k8s", "--image", IMAGE, "--env", "RANK=3", "--", "x.py"], "the operator sets this variable"),
    (["k8s", "--image", IMAGE, "--grace-period", "10", "--", "shoal", "train"], "shorter than the command's"),
    (
        ["k8s", "--kind", "trainjob", "--image", IMAGE, "--max-restarts", "2", "--", "x.py"],
        "a TrainJob cannot set how often",
    ),
    (["runai", "--image", IMAGE, "--secret-env", "T=s:k", "--", "x.py"], "no flag that references a Kubernetes secret"),
    (["runai", "--image", IMAGE, "--nodes", "1", "--", "x.py"], "a master and at least one worker"),
    (["image", "--", "/abs/train.py"], "lies outside the build context"),
    (["image", "--requirements", "../req.txt", "--", "train.py"], "lies outside the build context"),
    (["k8s", "--image", IMAGE], "no command given"),
    *[
        ([*cli[:1], "--image", IMAGE, *cli[1:], "--volume", "shared:/shared", "--", *FT_TRAIN], message)
        for cli, message in [
            (["k8s"], "a lost pod would take every replica group with it"),
            (["k8s", "--nodes", "2", "--kind", "trainjob", "--max-restarts", "3"], "a TrainJob cannot set how often"),
            (["k8s", "--nodes", "2", "--kind", "mpijob"], "not as an MPIJob"),
            (["runai", "--nodes", "2"], "not as a Run:ai submit command"),
            (["k8s", "--nodes", "2", "--elastic", "1:2"], "--elastic restarts every pod"),
            (["k8s", "--nodes", "2", "--max-restarts", "0"], "first pod that restarts would fail"),
        ]
    ],
    (
        ["k8s", "--image", IMAGE, "--nodes", "2", "-g", "1", "--volume", "s:/s", "--", *FT_TRAIN[:4], "--out", "/s/r"],
        "runs on the CPU for now",
    ),
    (["k8s", "--image", IMAGE, "--nodes", "2", "--", *FT_TRAIN], "which no writable --volume holds"),
]


@pytest.mark.parametrize("argv, message", BAD_INPUT, ids=[" ".join(a[:6])[:60] for a, _ in BAD_INPUT])
def test_cli_bad_input_is_one_line_with_a_hint_and_writes_nothing(argv, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no kubectl: a valid job would be written here
    with pytest.raises(ShoalError, match=message) as err:
        launch_cli.main_raw(argv)
    assert err.value.hint and "\n" not in err.value.message and "\n" not in err.value.hint
    for secret in ("hf_abc123", "=pw"):
        assert secret not in err.value.message + err.value.hint
    assert list(tmp_path.iterdir()) == []


def test_a_fault_tolerant_image_installs_shoal_with_torchft_however_it_is_named():
    from shoal.jobs.kubernetes.image import with_extras

    cases = {
        "shoal==0.1.0": "shoal[ft]==0.1.0",
        "shoal[tensorflow]>=0.1": "shoal[tensorflow,ft]>=0.1",
        "shoal[ft]": "shoal[ft]",
        ".": ".[ft]",  # the build context is shoal's checkout
        "./shoal-0.1.0-py3-none-any.whl": "./shoal-0.1.0-py3-none-any.whl[ft]",
        "shoal@https://example.com/shoal.whl": "shoal[ft]@https://example.com/shoal.whl",
    }
    assert {r: with_extras(r, ("ft",)) for r in cases} == cases
    assert with_extras("shoal==0.1.0", ()) == "shoal==0.1.0"
    built = render_dockerfile(JobSpec(command=FT_TRAIN), shoal_requirement=".")
    assert "RUN pip install --no-cache-dir '.[ft]'" in built
