"""Every object shoal renders passes the operators' CRD schemas; the validator itself catches what the API server would.

The schemas are the CRDs' own (``../shared/data/k8s-crds``: training-operator release-1.9, MPI operator
caa3c47, Trainer 8c0f505); :mod:`k8s.crd_schema` applies them with Kubernetes' extensions. The
second half of this file shows the validator failing where the API server refuses an object, so a
pass above means something.
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path

import pytest
import yaml

from k8s import crd_schema, sim_lighthouse, sim_trainjob
from k8s.crd_schema import assert_valid, errors
from k8s.sim_cluster import SimulationError
from shoal.jobs.kubernetes import trainjob
from shoal.jobs.kubernetes.mpijob import render_mpijob
from shoal.jobs.kubernetes.options import PodOptions, SecretEnv, VolumeClaim
from shoal.jobs.kubernetes.pytorchjob import render_pytorchjob
from shoal.jobs.kubernetes.trainjob import render_trainjob
from shoal.jobs.spec import JobSpec

pytestmark = pytest.mark.skipif(not crd_schema.CRD_DIR.is_dir(), reason=f"no CRDs at {crd_schema.CRD_DIR}")
GOLDEN = Path(__file__).parents[1] / "jobs" / "golden" / "k8s"
RUNTIME = yaml.safe_load((Path(__file__).parent / "data" / "torch_distributed_runtime.yaml").read_text())
RENDERERS = {"pytorchjob": render_pytorchjob, "trainjob": render_trainjob, "mpijob": render_mpijob}

COMMANDS = [
    ("shoal", "train", "digits", "--epochs", "1"),
    ("train.py", "--lr", "0.1"),
    ("-m", "pkg.train"),
    ("python", "-c", "print(1)"),
]
PODS = [
    PodOptions(image="img:1"),
    PodOptions(
        image="registry.example.com:5000/team/img@sha256:" + "a" * 64,
        namespace="research",
        cpu="500m",
        memory="1.5Gi",
        shm_size="2Gi",
        secret_env=(SecretEnv("HF_TOKEN", "hf", "token"), SecretEnv("WANDB_API_KEY", "wandb.creds", "key.v1")),
        volumes=(VolumeClaim("data.store", "/data", read_only=True), VolumeClaim("ckpt", "/ckpt")),
        grace_period_s=600,
    ),
]


def _jobs():
    for kind, command, pods, (nodes, nproc, gpus) in itertools.product(
        RENDERERS, COMMANDS, PODS, [(1, 1, 0), (2, "auto", 0), (4, 8, 8), (3, "auto", 2)]
    ):
        yield kind, (JobSpec(command=command, job_name="job", nodes=nodes, nproc=nproc, gpus_per_node=gpus), pods)


@pytest.mark.parametrize("kind, spec", list(_jobs()))
def test_every_rendering_passes_its_crd_schema(kind, spec):
    assert_valid(RENDERERS[kind](*spec))


def test_elastic_pytorchjob_passes_its_crd_schema():
    spec = JobSpec(command=("shoal", "train"), nodes=2, max_restarts=3)
    assert_valid(render_pytorchjob(spec, PodOptions(image="i", elastic=(1, 4))))


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.yaml")), ids=lambda p: p.name)
def test_golden_manifests_pass_their_crd_schema(path):
    assert_valid(yaml.safe_load(path.read_text()))


def test_the_torch_distributed_runtime_passes_its_crd_and_every_trainjob_names_it():
    assert_valid(RUNTIME)
    for path in sorted(GOLDEN.glob("trainjob*.yaml")):
        sim_trainjob.admit(yaml.safe_load(path.read_text()), RUNTIME)  # raises if Trainer would refuse it


def test_a_trainjob_naming_another_runtime_is_refused():
    job = render_trainjob(JobSpec(command=("train.py",)), PodOptions(image="i"), runtime="deepspeed-distributed")
    assert_valid(job)  # the schema cannot know which runtimes exist
    with pytest.raises(SimulationError, match="must be created before the TrainJob"):
        sim_trainjob.admit(job, RUNTIME)


def test_a_fault_tolerant_trainjob_is_admitted_beside_its_lighthouse_and_cannot_set_its_restarts():
    """The TrainJob passes Trainer's CRD and webhook, its lighthouse the API server's rules
    (k8s/sim_lighthouse.py). Its runtime patch cannot carry the pods' restartPolicy, a container's,
    the Job's backoffLimit nor a JobSet failurePolicy (kubeflow/trainer 8c0f505,
    pkg/apis/trainer/v1alpha1/trainjob_types.go JobSetSpecPatch, JobSpecPatch, PodSpecPatch,
    ContainerPatch): why a fault-tolerant TrainJob refuses --max-restarts."""
    command = ("shoal", "train", "digits", "--fault-tolerance", "--out", "/ckpt/run")
    spec = JobSpec(command=command, job_name="ft", nodes=2, nproc=1)
    deployment, service, job = sim_lighthouse.split(trainjob.render_objects(spec, PODS[1]))
    assert_valid(job)
    sim_trainjob.admit(job, RUNTIME)
    sim_lighthouse.admit(deployment, service)
    jobset = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    job_spec = jobset["replicatedJobs"][0]["template"]["spec"]
    pod = job_spec["template"]["spec"]
    for where, field, value in [
        (pod, "restartPolicy", "OnFailure"),
        (pod["containers"][0], "restartPolicy", "OnFailure"),
        (job_spec, "backoffLimit", 10),
        (jobset, "failurePolicy", {"maxRestarts": 10}),
    ]:
        where[field] = value
        assert any(f"'{field}' was unexpected" in e for e in errors(job)), field
        del where[field]
    assert errors(job) == []


# ---- the validator refuses what the API server refuses -------------------------------------


def _golden(name: str) -> dict:
    return yaml.safe_load((GOLDEN / name).read_text())


def _container(job: dict) -> dict:
    return job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]


def test_unknown_fields_are_errors_as_with_strict_field_validation():
    job = _golden("pytorchjob_gpu.yaml")
    _container(job)["imagePullPolcy"] = "Always"  # misspelled
    job["spec"]["runPolicy"]["backOffLimit"] = 2  # wrong case
    found = errors(job)
    assert any("'imagePullPolcy' was unexpected" in e for e in found)
    assert any("'backOffLimit' was unexpected" in e for e in found)


def test_types_enums_and_required_fields():
    job = _golden("mpijob.yaml")
    job["spec"]["mpiImplementation"] = "OpenMPI5"
    job["spec"]["slotsPerWorker"] = "4"
    del job["spec"]["mpiReplicaSpecs"]
    found = "\n".join(errors(job))
    assert "'OpenMPI5' is not one of" in found and "'4' is not of type 'integer'" in found
    assert "'mpiReplicaSpecs' is a required property" in found


def test_int_or_string_quantities():
    job = _golden("pytorchjob_gpu.yaml")
    resources = _container(job)["resources"]
    resources["limits"]["nvidia.com/gpu"] = 4  # an integer
    resources["requests"]["cpu"] = "500m"  # a string quantity
    assert errors(job) == []
    resources["requests"]["memory"] = "lots"
    assert any("'lots' does not match" in e for e in errors(job))


def test_list_map_keys_must_be_unique_defaults_included():
    job = _golden("pytorchjob_gpu.yaml")
    container = _container(job)
    container["env"].append({"name": "NCCL_DEBUG", "value": "WARN"})
    assert any("duplicate entry with {'name': 'NCCL_DEBUG'}" in e for e in errors(job))
    job = _golden("pytorchjob_gpu.yaml")
    # The same port twice, once with the protocol left to its default (TCP): one key.
    _container(job)["ports"] += [{"name": "other", "containerPort": 29500, "protocol": "TCP"}]
    assert any("'containerPort': 29500, 'protocol': 'TCP'" in e for e in errors(job))


def test_cel_rules_run_and_transition_rules_wait_for_an_update():
    job = _golden("trainjob.yaml")
    job["spec"]["trainer"]["numProcPerNode"] = 0
    job["metadata"]["name"] = "x" * 64
    found = "\n".join(errors(job))
    assert "numProcPerNode must be greater than or equal to 1" in found
    assert "metadata.name must be no more than 63 characters" in found
    assert "immutable" not in found  # `self == oldSelf` rules only apply to updates


def test_a_cel_rule_without_a_translation_is_an_error(monkeypatch):
    monkeypatch.delitem(crd_schema.CEL_RULES, "self >= 1")
    assert any("CEL rule without a translation" in e for e in errors(_golden("trainjob.yaml")))


def test_metadata_is_checked_as_object_meta():
    job = _golden("mpijob.yaml")
    job["metadata"]["namespace"] = "Team_A"
    job["metadata"]["labels"] = {"team": 7}
    job["metadata"]["uid"] = "set-by-the-server"
    found = "\n".join(errors(job))
    assert (
        "'Team_A' does not match" in found and "7 is not of type 'string'" in found and "'uid' was unexpected" in found
    )


def test_int32_range():
    job = copy.deepcopy(_golden("pytorchjob_elastic.yaml"))
    job["spec"]["elasticPolicy"]["maxReplicas"] = 2**31
    assert any("is not a 'int32'" in e for e in errors(job))
