"""shoal.flyte in this process: the tasks it makes (GPUs requested = processes started),
its errors, and the checkpoint mirror against flytekit's real ``SyncCheckpoint`` on local paths."""

# No ``from __future__ import annotations``: flytekit evaluates the annotations of the tasks made
# in these tests, which name a local variable.
import importlib.util
import json
import signal
import sys
import tempfile
import threading
from pathlib import Path

import pytest
import torch
from flyte_harness import EXAMPLE
from torch import nn

from procs import wait_for
from shoal.checkpoint.manager import CheckpointManager
from shoal.errors import ShoalError


@pytest.fixture(scope="module")
def flyte(tmp_path_factory):
    """The integration, imported with flytekit's SIGINT handler (set on import) taken back off and the
    sandbox directories flytekit makes on import (its default context's) in this test's tmp."""
    before, temporary = signal.getsignal(signal.SIGINT), tempfile.tempdir
    tempfile.tempdir = str(tmp_path_factory.mktemp("flytekit"))
    try:
        import flytekit

        import shoal.flyte as integration
    finally:
        signal.signal(signal.SIGINT, before)
        tempfile.tempdir = temporary
    return flytekit, integration


@pytest.fixture(scope="module")
def example(flyte):
    """examples/flyte_workflow.py, imported as flytekit imports it (a module it can find by name)."""
    spec = importlib.util.spec_from_file_location("flyte_workflow", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_the_examples_tasks_request_one_gpu_per_process_they_start(example):
    train, elastic = example.train, example.train_elastic
    assert train.resources.requests.gpu == train.resources.limits.gpu == example.WORKERS
    assert elastic.resources.requests.gpu == elastic.resources.limits.gpu == elastic.task_config.nproc_per_node
    assert elastic.task_config.nproc_per_node == example.WORKERS
    assert train.metadata.retries == 2 and train.metadata.cache and train.metadata.cache_version == "1"
    assert list(train.python_interface.outputs) == ["epoch_accuracies", "model_state"]
    assert train.python_interface.outputs["epoch_accuracies"] == list[float]


def test_train_task_sets_the_gpu_count_and_refuses_another(flyte):
    flytekit, integration = flyte
    resources = flytekit.Resources

    def body(epochs: int) -> integration.TrainOutputs:
        return integration.fit("digits", epochs=epochs)

    plain = integration.train_task(body, nproc=4, retries=1)
    assert plain.resources.requests.gpu == plain.resources.limits.gpu == 4 and plain.metadata.retries == 1
    split = integration.train_task(nproc=2, requests=resources(mem="2Gi"), limits=resources(mem="4Gi"))(body)
    assert (split.resources.requests.gpu, split.resources.requests.mem) == (2, "2Gi")
    assert (split.resources.limits.gpu, split.resources.limits.mem) == (2, "4Gi")
    with_memory = integration.train_task(body, nproc=2, resources=resources(mem="8Gi"))
    assert (with_memory.resources.requests.gpu, with_memory.resources.limits.gpu) == (2, 2)
    assert with_memory.resources.requests.mem == "8Gi"
    cpu = integration.train_task(body, nproc=2, gpu=False, resources=resources(cpu="2"))
    assert cpu.resources.requests.gpu is None and cpu.resources.requests.cpu == "2"
    with pytest.raises(ShoalError, match=r"nproc=2\) with resources=Resources\(gpu=1\)") as info:
        integration.train_task(body, nproc=2, resources=resources(gpu=1))
    assert "gpu=False" in info.value.hint
    with pytest.raises(ShoalError, match="at least 1"):
        integration.train_task(body, nproc=0)
    assert integration.resources(3, mem="1Gi") == resources(gpu=(3, 3), mem="1Gi")  # request and limit


def test_fit_in_a_train_task_starts_the_tasks_process_count_only(flyte):
    _, integration = flyte

    def body() -> integration.TrainOutputs:
        return integration.fit("digits", nproc=3)

    task = integration.train_task(body, nproc=2)
    with pytest.raises(ShoalError, match=r"fit\(nproc=3\) inside train_task\(nproc=2\)"):
        task._task_function()  # the body as Flyte calls it: refused before anything starts


def test_bad_input_is_a_shoal_error_with_its_hint_in_flytes_report_and_leaves_nothing(flyte, tmp_path):
    flytekit, integration = flyte
    with pytest.raises(ShoalError, match="unknown option") as info:
        integration.fit("digits", epoch_count=3, out=str(tmp_path / "run"))
    assert any(note.startswith("HINT: use shoal train's flags") for note in getattr(info.value, "__notes__", []))
    assert not (tmp_path / "run").exists()
    sandbox = Path(flytekit.current_context().working_directory)  # where fit() makes its run directory
    before = set(sandbox.glob("shoal-*"))
    with pytest.raises(ShoalError, match="--epochs must be at least 1"):
        integration.fit("digits", epochs=0)
    assert set(sandbox.glob("shoal-*")) == before


def _save(manager: CheckpointManager, model: nn.Module, step: int) -> None:
    with torch.no_grad():
        model.weight.fill_(step)
    manager.save(epoch=1, step=step, objects={"model": model}, extra={"epoch": 1})


def _names(directory) -> list[str]:
    return sorted(p.name for p in directory.glob("ckpt-*.pt")) if directory.is_dir() else []


def test_the_mirror_copies_checkpoints_to_flyte_and_a_retry_restores_them(flyte, tmp_path):
    from flytekit.core.checkpointer import SyncCheckpoint

    from shoal.flyte import CheckpointMirror

    model = nn.Linear(2, 2)
    run = tmp_path / "attempt-0" / "run"
    run.mkdir(parents=True)
    manager = CheckpointManager(run / "checkpoints", keep=2)
    flyte_0 = tmp_path / "flyte" / "attempt-0" / "_flytecheckpoints"
    mirror = CheckpointMirror(SyncCheckpoint(checkpoint_dest=str(flyte_0)), run, manager.directory, interval=0.02)
    assert mirror.restore() == []  # a first attempt: nothing to restore
    (run / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "test_accuracy": 0.5}) + "\n")
    with mirror:
        for step in (10, 20, 30, 40):
            _save(manager, model, step)
            wait_for(lambda: _names(flyte_0) == _names(manager.directory), timeout=60)
    assert _names(flyte_0) == ["ckpt-e00001-s000000030.pt", "ckpt-e00001-s000000040.pt"]  # keep=2, here too
    assert (flyte_0 / "metrics.jsonl").read_text() == (run / "metrics.jsonl").read_text()
    assert not (flyte_0 / "latest").exists() and mirror.failure is None

    # The retry: a fresh run directory, Flyte's previous checkpoint handed over as flytepropeller does.
    run_1 = tmp_path / "attempt-1" / "run"
    run_1.mkdir(parents=True)
    flyte_1 = tmp_path / "flyte" / "attempt-1" / "_flytecheckpoints"
    checkpoint_1 = SyncCheckpoint(checkpoint_dest=str(flyte_1), checkpoint_src=str(flyte_0))
    retry = CheckpointMirror(checkpoint_1, run_1, run_1 / "checkpoints")
    assert retry.restore() == _names(flyte_0)
    assert _names(flyte_1) == _names(flyte_0)  # carried forward before any training
    assert (run_1 / "metrics.jsonl").read_text() == (run / "metrics.jsonl").read_text()
    found = CheckpointManager(run_1 / "checkpoints").load_latest()
    assert found.step == 40 and torch.equal(found.payload["state"]["model"]["weight"], torch.full((2, 2), 40.0))

    # A run directory with checkpoints of its own resumes from them; Flyte's copy is not used.
    again = CheckpointMirror(
        SyncCheckpoint(checkpoint_dest=str(tmp_path / "x"), checkpoint_src=str(flyte_0)), run, manager.directory
    )
    assert again.restore() == [] and _names(manager.directory) == _names(flyte_0)


def test_the_mirror_carries_sharded_checkpoints_as_directories(flyte, tmp_path):
    """A ``.dcp`` checkpoint (FSDP, --async-checkpoint) is a directory: it goes up under its own name
    (flytekit uploads a directory's contents), retention removes it there whole, a retry restores it."""
    from flytekit.core.checkpointer import SyncCheckpoint

    from shoal.checkpoint.manager import restore
    from shoal.flyte import CheckpointMirror

    model = nn.Linear(2, 2)
    run = tmp_path / "attempt-0" / "run"
    run.mkdir(parents=True)
    manager = CheckpointManager(run / "checkpoints", keep=2, sharded=True)
    flyte_0 = tmp_path / "flyte" / "attempt-0" / "_flytecheckpoints"
    mirror = CheckpointMirror(SyncCheckpoint(checkpoint_dest=str(flyte_0)), run, manager.directory, interval=0.02)

    def dcp_names(directory):
        return sorted(p.name for p in directory.glob("ckpt-*.dcp") if p.is_dir()) if directory.is_dir() else []

    with mirror:
        for step in (10, 20, 30):
            _save(manager, model, step)
            wait_for(lambda: dcp_names(flyte_0) == dcp_names(manager.directory), timeout=60)
    assert dcp_names(flyte_0) == ["ckpt-e00001-s000000020.dcp", "ckpt-e00001-s000000030.dcp"]  # keep=2
    shards = sorted(p.name for p in (manager.directory / "ckpt-e00001-s000000030.dcp").iterdir())
    assert sorted(p.name for p in (flyte_0 / "ckpt-e00001-s000000030.dcp").iterdir()) == shards
    assert not list(run.glob(".tmp-flyte-*")) and mirror.failure is None

    run_1 = tmp_path / "attempt-1" / "run"
    run_1.mkdir(parents=True)
    retry = CheckpointMirror(
        SyncCheckpoint(checkpoint_dest=str(tmp_path / "flyte" / "attempt-1"), checkpoint_src=str(flyte_0)),
        run_1,
        run_1 / "checkpoints",
    )
    assert retry.restore() == dcp_names(flyte_0)
    found = CheckpointManager(run_1 / "checkpoints", sharded=True).load_latest()
    fresh = nn.Linear(2, 2)
    restore(found, {"model": fresh})
    assert found.step == 30 and torch.equal(fresh.weight.detach(), torch.full((2, 2), 30.0))


def test_a_failing_mirror_is_reported_once_and_training_goes_on(flyte, tmp_path, capfd):
    from flytekit.core.checkpointer import SyncCheckpoint

    from shoal.flyte import CheckpointMirror

    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    run = tmp_path / "run"
    manager = CheckpointManager(run / "checkpoints", keep=3)
    mirror = CheckpointMirror(
        SyncCheckpoint(checkpoint_dest=str(blocker / "cp")), run, manager.directory, interval=0.02
    )
    model = nn.Linear(2, 2)
    with mirror:
        _save(manager, model, 1)
        wait_for(lambda: mirror.failure is not None, timeout=60)
        _save(manager, model, 2)  # training goes on; nothing more is tried
    assert _names(manager.directory) == ["ckpt-e00001-s000000001.pt", "ckpt-e00001-s000000002.pt"]
    err = capfd.readouterr().err
    assert err.count("copying checkpoints to Flyte's checkpoint failed") == 1 and "training goes on" in err
    assert not any(t.name == "shoal-flyte-checkpoint" for t in threading.enumerate())


BROKEN_WORKLOAD = """
import shoal


class Broken(shoal.Workload):
    def load(self, cfg, device, rank=0):
        raise ValueError(f"the user's loader fails on rank {rank}")
"""


@pytest.mark.multiprocess
def test_a_worker_whose_own_code_raises_is_not_retried(flyte, tmp_path, capfd):
    """The workload raises in both real workers: fit() raises the report as a ShoalError (a user error
    to Flyte, never retried: the retry would fail the same way), not FlyteRecoverableException."""
    from flytekit.exceptions.user import FlyteRecoverableException

    _, integration = flyte
    (tmp_path / "broken.py").write_text(BROKEN_WORKLOAD)
    with pytest.raises(ShoalError) as info:
        integration.fit(f"{tmp_path / 'broken.py'}:Broken", nproc=2, device="cpu", out=str(tmp_path / "run"))
    assert not isinstance(info.value, FlyteRecoverableException) and info.value.raised
    assert "failed with exit code 2" in info.value.format()  # a shoal error, said by the worker itself:
    assert "load() of Broken failed: ValueError: the user's loader fails on rank" in capfd.readouterr().err
