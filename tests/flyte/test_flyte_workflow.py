"""The Flyte tutorial's workflow with shoal (examples/flyte_workflow.py), run by real flytekit.

- ``pyflyte run`` (local execution) given real MNIST: typed outputs equal to the run's files, and a
  second run with the same inputs answered from flytekit's local cache;
- the workflow called in Python: the outputs' types, a model that loads weights-only and scores the
  accuracy reported, and Flyte's checkpoint (the sandbox's) holding the run's checkpoints;
- retries: a task run three times the way a Flyte pod runs it (``pyflyte-execute`` with the
  checkpoint locations flytepropeller passes), the first attempt preempted (SIGTERM), the second
  lost (SIGKILL of the whole pod), each retry resuming from Flyte's checkpoint, and the final
  weights bit for bit those of an uninterrupted run.
"""

from __future__ import annotations

import math
import signal
import struct
import subprocess
from pathlib import Path

import pytest
import torch
from flyte_harness import (
    TIMEOUT,
    Attempt,
    cache_keys,
    call_workflow,
    digits_test_accuracy,
    flyte_environment,
    load_digits_model,
    metrics,
    on_module_path,
    printed_outputs,
    pyflyte_run,
    read_error,
    read_outputs,
    run_dirs,
    same_weights,
    write_inputs,
)

from procs import kill_group, start_cmd, wait_for

pytestmark = pytest.mark.multiprocess

# Small batches (360 optimizer steps per epoch) and a checkpoint every 100 steps, so that there is
# time to interrupt a run between two checkpoints.
RESUMABLE = {"epochs": 3, "batch_size": 2, "checkpoint_every": "100steps"}
TASK_INPUTS = {"data": "", "tracker": "", **RESUMABLE}
# The first images of real MNIST's training and test files: enough for the workload's CNN to pass 90%
# in one epoch. A full epoch of all 60,000 is trained by tests/workloads/test_workloads.py.
MNIST_PART = {"train": 10_000, "t10k": 2_000}


@pytest.fixture(scope="module")
def mnist_part(mnist_root, tmp_path_factory) -> Path:
    """Real MNIST cut to its first MNIST_PART images, in the same IDX files (the header's count
    rewritten): magic (0, 0, type, number of dimensions), the dimensions (big-endian), the items."""
    root = tmp_path_factory.mktemp("mnist-part")
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for path in sorted((mnist_root / "MNIST" / "raw").iterdir()):
        data = path.read_bytes()
        head = 4 + 4 * data[3]
        count = MNIST_PART[path.name.split("-")[0]]
        item = math.prod(struct.unpack(f">{data[3]}I", data[4:head])[1:])  # bytes per image or label
        (raw / path.name).write_bytes(
            data[:4] + struct.pack(">I", count) + data[8:head] + data[head : head + count * item]
        )
    return root


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """``training_workflow(**RESUMABLE)`` called in Python: (process, driver's report, run dir, env)."""
    tmp = tmp_path_factory.mktemp("flyte-call")
    env = flyte_environment(tmp)
    proc, report = call_workflow(env, tmp, "training_workflow", **RESUMABLE)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run,) = run_dirs(proc.stdout)
    return proc, report, run, env


@pytest.mark.slow
def test_pyflyte_run_trains_given_data_and_a_second_run_is_a_cache_hit(tmp_path, mnist_part):
    """``pyflyte run`` with ``--data``: the task trains real MNIST (the workload's CNN, not the digits
    MLP of the other tests) on two workers, and its typed outputs are the run's; the same inputs
    again are answered from flytekit's local cache. (That the returned model scores the accuracy
    reported: test_the_workflow_called_in_python_returns_accuracies_and_a_model_file.)"""
    env = flyte_environment(tmp_path)
    args = ("--data", str(mnist_part), "--epochs", "1", "--batch_size", "32")
    first = pyflyte_run(env, tmp_path, "training_workflow", *args)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "shoal train mnist" in first.stdout
    assert "workers started by fork" in first.stdout  # by shoal's launcher, inside the task
    accuracies, model_path = printed_outputs(first.stdout)
    (run,) = run_dirs(first.stdout)
    records = metrics(run)
    assert accuracies == [r["test_accuracy"] for r in records] and accuracies[0] > 0.9
    assert [r["world_size"] for r in records] == [2]  # train_task(nproc=2): two workers
    assert [r["samples_seen"] for r in records] == [MNIST_PART["train"]]  # every training image once
    state = torch.load(model_path, weights_only=True)
    assert any(tensor.dim() == 4 for tensor in state.values())  # the workload's CNN, not the digits MLP
    (key,) = cache_keys(env)
    assert key.startswith("flyte_workflow.train-1-")  # task name, cache_version "1", inputs' hash

    second = pyflyte_run(env, tmp_path, "training_workflow", *args)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "Cache hit" in second.stdout + second.stderr
    assert "shoal train" not in second.stdout and not run_dirs(second.stdout)  # nothing trained
    assert printed_outputs(second.stdout) == (accuracies, model_path)
    assert cache_keys(env) == [key]


def test_the_workflow_called_in_python_returns_accuracies_and_a_model_file(uninterrupted):
    proc, report, run, _ = uninterrupted
    assert report["type"] == "TrainOutputs" and report["fields"] == ["epoch_accuracies", "model_state"]
    assert report["accuracies_type"] == "list" and report["accuracy_types"] == ["float"]
    assert report["model_is_flyte_file"]
    records = metrics(run)
    assert report["accuracies"] == [r["test_accuracy"] for r in records] and len(records) == 3
    assert [r["samples_seen"] for r in records] == [1440] * 3  # every training sample once per epoch
    model = load_digits_model(report["model_path"])
    assert digits_test_accuracy(model) == pytest.approx(report["accuracies"][-1], abs=1e-12)
    assert same_weights(report["model_path"], run / "model.pt")
    # Locally Flyte's checkpoint is the task sandbox's __cp (flytekit core/context_manager.py,
    # with_task_sandbox), beside the run directory fit() made there: it holds what the run keeps.
    flyte_checkpoint = run.parent / "__cp"
    kept = sorted(p.name for p in (run / "checkpoints").glob("ckpt-*.pt"))
    assert len(kept) == 3 and sorted(p.name for p in flyte_checkpoint.glob("ckpt-*.pt")) == kept
    assert (flyte_checkpoint / "metrics.jsonl").read_text() == (run / "metrics.jsonl").read_text()


def test_retries_resume_from_flytes_checkpoint_and_end_with_the_uninterrupted_weights(tmp_path, uninterrupted):
    _, reference, _, _ = uninterrupted
    env = on_module_path(flyte_environment(tmp_path))
    inputs = tmp_path / "inputs.pb"
    write_inputs(env, inputs, "train", **TASK_INPUTS)
    attempts = [Attempt(tmp_path / f"attempt-{n}") for n in range(3)]

    # Attempt 0: preempted (SIGTERM to the pod's process) once a checkpoint reached Flyte's.
    first = start_cmd(*attempts[0].command(inputs, "train", None), env=env, cwd=tmp_path)
    try:
        wait_for(lambda: attempts[0].checkpoint_files() or first.poll() is not None, timeout=TIMEOUT)
        assert first.poll() is None, "finished before it could be preempted"
        first.send_signal(signal.SIGTERM)
        out0, err0 = first.communicate(timeout=TIMEOUT)
    finally:
        kill_group(first)
    error = read_error(attempts[0].outputs)
    assert error.kind == error.RECOVERABLE, error.message  # so flytepropeller retries it
    assert "SIGTERM" in error.message
    assert not (attempts[0].outputs / "outputs.pb").exists()
    preempted = attempts[0].checkpoint_files()[-1]  # the preemption's own checkpoint, copied on the way out

    # Attempt 1: resumes, then the whole pod is lost (SIGKILL) after a checkpoint of its own.
    second = start_cmd(*attempts[1].command(inputs, "train", attempts[0]), env=env, cwd=tmp_path)
    try:
        wait_for(lambda: attempts[1].checkpoint_files()[-1:] > [preempted] or second.poll() is not None, TIMEOUT)
        assert second.poll() is None, "finished before it could be killed"
        kill_group(second)
        out1, err1 = second.communicate(timeout=TIMEOUT)
    finally:
        kill_group(second)
    assert "resuming from the previous attempt's Flyte checkpoint" in out1, out1[-3000:] + err1[-3000:]
    assert f"checkpoints/{preempted}: epoch" in out1  # shoal resumed from the preemption checkpoint
    assert not any(attempts[1].outputs.glob("*.pb"))  # killed: no outputs, no error document
    lost = attempts[1].checkpoint_files()[-1]

    # Attempt 2: resumes from attempt 1's newest copied checkpoint and completes.
    third = subprocess.run(
        attempts[2].command(inputs, "train", attempts[1]), capture_output=True, text=True, timeout=TIMEOUT, env=env
    )
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert f"checkpoints/{lost}: epoch" in third.stdout, third.stdout[-3000:]
    accuracies, model_uri = read_outputs(attempts[2].outputs)
    assert accuracies == reference["accuracies"]
    assert same_weights(model_uri, reference["model_path"])  # bit for bit: no step lost or done twice
    (run,) = run_dirs(third.stdout)
    assert [r["epoch"] for r in metrics(run)] == [1, 2, 3]  # epochs logged by earlier attempts included
    # Flyte's checkpoint of the last attempt mirrors the run's (shoal's retention included).
    assert attempts[2].checkpoint_files() == sorted(p.name for p in (run / "checkpoints").glob("ckpt-*.pt"))
