"""The Flyte task trains a user's workload: a spec string as the task's input, the run directory
in the task's sandbox named after it, the outputs from the user's model."""

# No ``from __future__ import annotations``: flytekit evaluates the task's annotations.
import signal
import tempfile
from pathlib import Path

import pytest
import torch

from workloads.user_workload_files import GOOD, write


@pytest.fixture(scope="module")
def integration(tmp_path_factory):
    """shoal.flyte, with flytekit's SIGINT handler (set on import) taken back off and
    its import-time sandbox in this test's tmp (as tests/flyte/test_flyte_api.py does)."""
    before, temporary = signal.getsignal(signal.SIGINT), tempfile.tempdir
    tempfile.tempdir = str(tmp_path_factory.mktemp("flytekit"))
    try:
        import shoal.flyte as flyte
    finally:
        signal.signal(signal.SIGINT, before)
        tempfile.tempdir = temporary
    return flyte


def test_train_task_trains_a_user_workload_named_by_its_input(integration, tmp_path, monkeypatch):
    import flytekit

    write(tmp_path, "my_workload.py", GOOD)
    monkeypatch.chdir(tmp_path)

    def body(spec: str, epochs: int) -> integration.TrainOutputs:
        return integration.fit(spec, epochs=epochs, device="cpu", progress=False)

    task = integration.train_task(body, nproc=1, gpu=False)
    assert list(task.python_interface.inputs) == ["spec", "epochs"]
    outputs = task._task_function("my_workload.py:Tiny", 1)  # the body as Flyte calls it
    assert len(outputs.epoch_accuracies) == 1 and outputs.epoch_accuracies[0] > 1 / 3
    state = torch.load(outputs.model_state.path, weights_only=True)
    assert state["0.weight"].shape == (16, 4)  # the user's model, hidden=16
    sandbox = Path(flytekit.current_context().working_directory)
    assert [p.name.startswith("shoal-Tiny-") for p in sandbox.glob("shoal-*")] == [True]
