"""The operator simulations follow their sources' rules (each test names the rule and where it lives).

Sources: kubeflow/training-operator v1.9.0 (v1.6.0 and v1.7.0 where versions differ), kubeflow/trainer
8c0f505 with kubernetes-sigs/jobset v0.12.0, kubeflow/mpi-operator caa3c47 (v0.8.2); Kubernetes'
Job controller and kubelet for what the cluster adds. The simulated pods then run for real in
``tests/cluster_mpi/test_mpijob_pods.py`` (and, for PyTorchJob and TrainJob pods, in the in-pod
launcher's tests).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from k8s import sim_mpijob, sim_pytorchjob, sim_trainjob
from k8s.sim_cluster import SimulationError, expand, resolvable_names
from shoal.env.operator import operator_defaults
from shoal.jobs.kubernetes import pytorchjob, trainjob
from shoal.jobs.kubernetes.mpijob import render_mpijob
from shoal.jobs.kubernetes.options import PodOptions, SecretEnv, VolumeClaim
from shoal.jobs.kubernetes.pytorchjob import render_pytorchjob
from shoal.jobs.kubernetes.trainjob import render_trainjob
from shoal.jobs.spec import JobSpec

RUNTIME = yaml.safe_load((Path(__file__).parent / "data" / "torch_distributed_runtime.yaml").read_text())
TRAIN = ("shoal", "train", "digits", "--epochs", "2", "--device", "cpu", "--out", "/mnt/shared/run")
PODS = PodOptions(image="shoal:test", namespace="team", volumes=(VolumeClaim("shared", "/mnt/shared"),))


def _spec(pods: PodOptions = PODS, **kw) -> tuple[JobSpec, PodOptions]:
    return JobSpec(**{"command": TRAIN, "job_name": "digits", **kw}), pods


def _env(pod, *names):
    return tuple(pod.env.get(n) for n in names)


# ---- PyTorchJob (training-operator) ----------------------------------------------------------------


def test_pytorchjob_two_pods_one_process_each():
    master, worker = sim_pytorchjob.simulate(render_pytorchjob(*_spec(nodes=2, nproc=1)))
    # pod.go createNewPod + util.go GenGeneralName: <job>-<type>-<index>; no hostname: the pod's name
    assert [(p.name, p.hostname, p.services) for p in (master, worker)] == [
        ("digits-master-0", "digits-master-0", ["digits-master-0"]),
        ("digits-worker-0", "digits-worker-0", ["digits-worker-0"]),
    ]
    names = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "PET_NODE_RANK", "PET_NNODES", "PET_NPROC_PER_NODE")
    assert _env(master, *names) == ("digits-master-0", "29500", "0", "2", "0", "2", "1")
    assert _env(worker, *names) == ("digits-master-0", "29500", "1", "2", "1", "2", "1")  # workers after the master
    assert (master.env["PET_MASTER_ADDR"], master.env["PET_MASTER_PORT"], master.env["PYTHONUNBUFFERED"]) == (
        "digits-master-0",
        "29500",
        "1",
    )
    assert master.argv == list(TRAIN) and worker.argv == list(TRAIN)  # the command as the manifest says
    assert master.termination_grace_s == 30 and master.restart_policy == "OnFailure"


def test_pytorchjob_world_size_counts_processes_since_1_7_and_pods_before():
    """envvar.go: WORLD_SIZE = pods x nprocPerNode (1.7+); pods only in 1.6, where RANK still counts pods."""
    job = render_pytorchjob(*_spec(nodes=3, nproc=2))
    new = sim_pytorchjob.simulate(job, version=(1, 9))
    old = sim_pytorchjob.simulate(job, version=(1, 6))
    assert [(p.env["RANK"], p.env["WORLD_SIZE"]) for p in new] == [("0", "6"), ("1", "6"), ("2", "6")]
    assert [(p.env["RANK"], p.env["WORLD_SIZE"]) for p in old] == [("0", "3"), ("1", "3"), ("2", "3")]
    assert new[0].env["PET_NPROC_PER_NODE"] == "2" and new[0].env["PET_NNODES"] == "3"
    assert not any(name.startswith("PET_") for name in old[0].env) and old[0].env["PYTHONUNBUFFERED"] == "0"


def test_pytorchjob_auto_processes_count_as_one_in_world_size():
    """getNprocPerNodeInt: 'auto' is not a number, so WORLD_SIZE is the pod count; PET_NPROC_PER_NODE=auto."""
    pods = sim_pytorchjob.simulate(render_pytorchjob(*_spec(nodes=2, nproc="auto", gpus_per_node=0)))
    assert [(p.env["WORLD_SIZE"], p.env["PET_NPROC_PER_NODE"]) for p in pods] == [("2", "auto"), ("2", "auto")]


def test_pytorchjob_defaults_nproc_per_node_to_auto_since_1_7():
    job = render_pytorchjob(*_spec(nodes=2))
    del job["spec"]["nprocPerNode"]
    assert sim_pytorchjob.simulate(job)[0].env["PET_NPROC_PER_NODE"] == "auto"
    assert "PET_NPROC_PER_NODE" not in sim_pytorchjob.simulate(job, version=(1, 6))[0].env


def test_pytorchjob_1_7_sets_nproc_only_with_a_master():
    """1.7 put PET_NPROC_PER_NODE inside the master block; 1.8 moved it out (envvar.go diff v1.7.0..v1.8.0)."""
    job = render_pytorchjob(*_spec(nodes=2, pods=PodOptions(image="i", elastic=(1, 2))))
    assert "PET_NPROC_PER_NODE" not in sim_pytorchjob.simulate(job, version=(1, 7))[0].env
    assert sim_pytorchjob.simulate(job, version=(1, 8))[0].env["PET_NPROC_PER_NODE"] == "1"


def test_elastic_pytorchjob_gets_the_rendezvous_not_ranks():
    """elastic.go: PET_RDZV_ENDPOINT on worker 0's Service, PET_NNODES=min:max; no Master, so no
    MASTER_ADDR, RANK or WORLD_SIZE (envvar.go sets those only with a Master)."""
    job = render_pytorchjob(*_spec(nodes=2, max_restarts=3, pods=PodOptions(image="i", elastic=(1, 4))))
    pods = sim_pytorchjob.simulate(job)
    assert [p.name for p in pods] == ["digits-worker-0", "digits-worker-1"]
    for pod in pods:
        assert _env(pod, "PET_RDZV_ENDPOINT", "PET_RDZV_BACKEND", "PET_NNODES", "PET_MAX_RESTARTS", "PET_RDZV_ID") == (
            "digits-worker-0:29500",
            "c10d",
            "1:4",
            "3",
            "digits",
        )
        assert not {"MASTER_ADDR", "RANK", "WORLD_SIZE"} & set(pod.env)
        assert pod.init_containers == []  # initcontainer.go: only with a Master


def test_pytorchjob_workers_wait_for_the_master_name():
    """initcontainer.go: workers get init-pytorch, nslookup of the master's Service up to 100 times."""
    master, worker = sim_pytorchjob.simulate(render_pytorchjob(*_spec(nodes=2)))
    assert master.init_containers == []
    (init,) = worker.init_containers
    assert init["image"] == "alpine:3.10" and "nslookup digits-master-0" in init["command"][2]


def test_pytorchjob_names_resolve_as_cluster_dns_answers():
    master, worker = sim_pytorchjob.simulate(render_pytorchjob(*_spec(nodes=2)))
    names = resolvable_names([master, worker], worker)
    for name in ("digits-master-0", "digits-master-0.team", "digits-master-0.team.svc.cluster.local"):
        assert names[name] == "digits-master-0"
    assert "digits-master-0.other" not in names


def test_pytorchjob_secrets_are_read_from_the_secret():
    job = render_pytorchjob(*_spec(pods=PodOptions(image="i", secret_env=(SecretEnv("HF_TOKEN", "hf", "token"),))))
    (master,) = sim_pytorchjob.simulate(job, secrets={"hf": {"token": "hf_xyz"}})
    assert master.env["HF_TOKEN"] == "hf_xyz"
    with pytest.raises(SimulationError, match="CreateContainerConfigError: secret 'hf' key 'token' not found"):
        sim_pytorchjob.simulate(job, secrets={})


def test_pytorchjob_admission_rules():
    """pytorchjob_webhook.go: DNS-1035 name, a `pytorch` container, one Master, Workers for elastic."""
    job = render_pytorchjob(*_spec(nodes=2))
    bad_name = copy.deepcopy(job)
    bad_name["metadata"]["name"] = "Digits"
    renamed = copy.deepcopy(job)
    renamed["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["name"] = "main"
    two_masters = copy.deepcopy(job)
    two_masters["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    for bad, message in [
        (bad_name, "DNS-1035"),
        (renamed, "container with name pytorch"),
        (two_masters, "Master].replicas: must be 1"),
    ]:
        with pytest.raises(SimulationError, match=message):
            sim_pytorchjob.simulate(bad)


def test_the_launch_script_pitfall_is_visible_in_the_pods_environment():
    """The seed's launch.sh passes --nnodes=$WORLD_SIZE to torchrun: right only while nprocPerNode is 1,
    since WORLD_SIZE counts processes (pods x nprocPerNode) and --nnodes counts pods."""
    pods = sim_pytorchjob.simulate(render_pytorchjob(*_spec(nodes=2, nproc=4)))
    nnodes_from_launch_sh = int(pods[0].env["WORLD_SIZE"])
    assert nnodes_from_launch_sh == 8 != len(pods) == int(pods[0].env["PET_NNODES"])


# ---- TrainJob (Trainer v2 + JobSet) ---------------------------------------------------------------


def test_trainjob_pods_get_pet_variables_only():
    pods = sim_trainjob.simulate(render_trainjob(*_spec(nodes=2, nproc=1)), RUNTIME)
    # JobSet: job <trainjob>-node-0; Job controller: hostname <job>-<index>, subdomain the JobSet
    assert [(p.hostname, p.subdomain, p.index) for p in pods] == [
        ("digits-node-0-0", "digits", 0),
        ("digits-node-0-1", "digits", 1),
    ]
    names = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
    assert [_env(p, *names) for p in pods] == [
        ("2", "1", "0", "digits-node-0-0.digits", "29500"),
        ("2", "1", "1", "digits-node-0-0.digits", "29500"),
    ]
    for pod in pods:
        assert not {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"} & set(pod.env)
        assert pod.env["JOB_COMPLETION_INDEX"] == str(pod.index)
        assert pod.argv == list(TRAIN) and pod.container["image"] == "shoal:test"
    names = resolvable_names(pods, pods[1])
    assert names["digits-node-0-0.digits"] == pods[0].name  # PET_MASTER_ADDR resolves through the search path


def test_trainjob_runtime_patch_brings_volumes_shm_and_grace():
    pods = sim_trainjob.simulate(render_trainjob(*_spec(nodes=2, pods=PODS)), RUNTIME)
    mounts = pods[0].mounts()
    assert mounts["/mnt/shared"] == {"name": "pvc-shared", "persistentVolumeClaim": {"claimName": "shared"}}
    assert mounts["/dev/shm"]["emptyDir"] == {"medium": "Memory"}
    assert pods[0].termination_grace_s == 30


def test_trainer_auto_counts_cpus_which_is_why_shoal_renders_a_number():
    """torch.go EnforceMLPolicy: numProcPerNode unset means auto; with no GPU, the CPU request (rounded up)."""
    job = render_trainjob(*_spec(nodes=2, pods=PodOptions(image="i", cpu="3500m")))
    assert job["spec"]["trainer"]["numProcPerNode"] == 1  # shoal's auto on CPU: one process per pod
    assert sim_trainjob.simulate(job, RUNTIME)[0].env["PET_NPROC_PER_NODE"] == "1"
    del job["spec"]["trainer"]["numProcPerNode"]
    assert sim_trainjob.simulate(job, RUNTIME)[0].env["PET_NPROC_PER_NODE"] == "4"  # Trainer's own auto
    gpu = render_trainjob(*_spec(command=("train.py",), nodes=2, gpus_per_node=2))
    del gpu["spec"]["trainer"]["numProcPerNode"]
    assert sim_trainjob.simulate(gpu, RUNTIME)[0].env["PET_NPROC_PER_NODE"] == "auto"


def test_trainjob_admission_rules():
    """torch.go Validate: no reserved PET_* in trainer.env; jobset.go: patches name what the runtime has."""
    job = render_trainjob(*_spec())
    reserved = copy.deepcopy(job)
    reserved["spec"]["trainer"]["env"] = [{"name": "PET_NNODES", "value": "4"}]
    with pytest.raises(SimulationError, match="reserved envs"):
        sim_trainjob.simulate(reserved, RUNTIME)
    wrong = copy.deepcopy(job)
    patch = wrong["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    patch["template"]["spec"]["template"]["spec"]["containers"][0]["name"] = "trainer"
    with pytest.raises(SimulationError, match="container 'trainer' is not in the runtime"):
        sim_trainjob.simulate(wrong, RUNTIME)


FT_TRAIN = (*TRAIN, "--fault-tolerance")


def test_a_fault_tolerant_trainjob_restarts_a_pod_alone_until_the_runtimes_backoff_limit():
    """What a TrainJob cannot set, its JobSet gets from the defaults: kubernetes-sigs/jobset v0.12.0
    pkg/webhooks/jobset_webhook.go Default, restartPolicy OnFailure (the kubelet restarts a failed
    container in place) and an Indexed Job (a lost pod is replaced for its index); kubernetes v1.32
    pkg/apis/batch/v1/defaults.go SetDefaults_Job, backoffLimit 6; pkg/controller/job/job_controller.go,
    the Job fails once its pods' container restarts sum to 6; jobset pkg/controllers/failure_policy.go,
    with no failurePolicy the JobSet then fails: no failure restarts every pod."""
    job = trainjob.render_objects(*_spec(command=FT_TRAIN, nodes=3, nproc=1))[-1]
    spec = sim_trainjob.jobset(job, RUNTIME)
    (node,) = spec["replicatedJobs"]
    job_spec = node["template"]["spec"]
    assert (job_spec["completionMode"], job_spec["parallelism"], job_spec["backoffLimit"]) == ("Indexed", 3, 6)
    assert job_spec["template"]["spec"]["restartPolicy"] == "OnFailure" and "failurePolicy" not in spec
    assert not sim_trainjob.job_fails(node, restarts=[0, 2, 3])  # five containers restarted, each alone
    assert not sim_trainjob.job_fails(node, restarts=[1], failed_pods=6)  # six pods lost and replaced
    assert sim_trainjob.job_fails(node, restarts=[0, 3, 3]) and sim_trainjob.job_fails(node, failed_pods=7)
    assert sim_trainjob.after_job_failure(spec) == "Failed"
    # A runtime's failurePolicy would restart the whole JobSet after that, never one pod.
    restarting = copy.deepcopy(RUNTIME)
    restarting["spec"]["template"]["spec"]["failurePolicy"] = {"maxRestarts": 2}
    assert sim_trainjob.after_job_failure(sim_trainjob.jobset(job, restarting), restarts_so_far=1) == "RestartJobSet"


def test_a_fault_tolerant_trainjobs_pods_give_the_launcher_what_a_pytorchjobs_do():
    """The in-pod part is proven on a PyTorchJob's pods (tests/train/ft/test_ft_k8s_pods.py): a TrainJob's
    pods run the same command, and shoal reads the same node rank, node count and processes from
    them (env/operator.py); only the master's name differs, and it resolves to node 0's pod."""
    tj = sim_trainjob.simulate(trainjob.render_objects(*_spec(command=FT_TRAIN, nodes=2, nproc=1))[-1], RUNTIME)
    pj = sim_pytorchjob.simulate(pytorchjob.render_objects(*_spec(command=FT_TRAIN, nodes=2, max_restarts=10))[-1])
    assert (
        [p.argv for p in tj]
        == [p.argv for p in pj]
        == [[*FT_TRAIN, "--lighthouse", "http://digits-lighthouse:29510"]] * 2
    )
    for node_rank, (t, p) in enumerate(zip(tj, pj, strict=True)):
        ours, theirs = operator_defaults(t.env, gpus=0), operator_defaults(p.env, gpus=0)
        assert (ours.pop("master_addr"), theirs.pop("master_addr")) == ("digits-node-0-0.digits", "digits-master-0")
        assert ours == theirs and (ours["node_rank"], ours["nnodes"], ours["nproc"]) == (node_rank, "2", 1)
    assert resolvable_names(tj, tj[1])["digits-node-0-0.digits"] == tj[0].name


# ---- MPIJob (MPI operator) -----------------------------------------------------------------------


def test_mpijob_hostfile_launcher_env_and_worker_command():
    job = sim_mpijob.simulate(render_mpijob(*_spec(nodes=3, nproc=2)))
    assert job.hostfile == (
        "digits-worker-0.digits.team.svc slots=2\n"
        "digits-worker-1.digits.team.svc slots=2\n"
        "digits-worker-2.digits.team.svc slots=2\n"
    )
    launcher = job.launcher
    assert (launcher.hostname, launcher.subdomain) == ("digits-launcher", "digits")
    assert _env(launcher, "OMPI_MCA_orte_default_hostfile", "OMPI_MCA_orte_keep_fqdn_hostnames") == (
        "/etc/mpi/hostfile",
        "true",
    )
    assert _env(launcher, "OMPI_MCA_plm_rsh_args", "OMPI_MCA_orte_set_default_slots", "K_MPI_JOB_ROLE") == (
        "-o ConnectionAttempts=10",
        "2",
        "launcher",
    )
    assert launcher.env["NVIDIA_VISIBLE_DEVICES"] == ""
    assert launcher.files["/etc/mpi/hostfile"] == job.hostfile
    assert set(launcher.mounts()) == {"/root/.ssh", "/etc/mpi"}
    assert launcher.argv[:3] == ["mpirun", "-np", "6"] and launcher.argv[-len(TRAIN) :] == list(TRAIN)
    for i, worker in enumerate(job.workers):
        assert (worker.name, worker.hostname, worker.argv) == (
            f"digits-worker-{i}",
            f"digits-worker-{i}",
            ["/usr/sbin/sshd", "-De"],
        )
        assert worker.env["K_MPI_JOB_ROLE"] == "worker" and "digits.team.svc.cluster.local" in worker.search
        assert set(worker.mounts()) == {"/mnt/shared", "/dev/shm", "/root/.ssh"}
        secret = worker.mounts()["/root/.ssh"]["secret"]
        assert secret["secretName"] == "digits-ssh" and secret["defaultMode"] == 0o600
    # the hostfile's names resolve from the launcher (search domain cluster.local)
    names = resolvable_names(job.pods, launcher)
    assert [names[line.split()[0]] for line in job.hostfile.splitlines()] == [w.name for w in job.workers]


def test_mpijob_cluster_domain_goes_into_the_hostfile():
    job = sim_mpijob.simulate(render_mpijob(*_spec(nodes=1)), cluster_domain="cluster.local")
    assert job.hostfile == "digits-worker-0.digits.team.svc.cluster.local slots=1\n"


def test_mpijob_admission_rules():
    """validation.go: the last worker's host name must be a DNS-1035 label; one launcher."""
    job = render_mpijob(*_spec(nodes=2))
    long_name = copy.deepcopy(job)
    long_name["metadata"]["name"] = "a" * 60
    with pytest.raises(SimulationError, match="invalid DNS label"):
        sim_mpijob.simulate(long_name)
    two = copy.deepcopy(job)
    two["spec"]["mpiReplicaSpecs"]["Launcher"]["replicas"] = 2
    with pytest.raises(SimulationError, match="Launcher].replicas: must be 1"):
        sim_mpijob.simulate(two)


# ---- what the kubelet does ------------------------------------------------------------------


def test_command_expansion_follows_kubernetes():
    env = {"MASTER_ADDR": "m-0", "PORT": "29500"}
    assert expand("--rdzv=$(MASTER_ADDR):$(PORT)", env) == "--rdzv=m-0:29500"
    assert expand("$$(MASTER_ADDR) $(MISSING) $WORLD_SIZE", env) == "$(MASTER_ADDR) $(MISSING) $WORLD_SIZE"
    job = render_pytorchjob(*_spec(nodes=2))
    container = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    container["args"] = ["--master=$(MASTER_ADDR)"]
    assert sim_pytorchjob.simulate(job)[1].argv[-1] == "--master=digits-master-0"
