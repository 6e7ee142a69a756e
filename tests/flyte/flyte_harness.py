"""What the Flyte tests share: flytekit's environment kept in a temporary directory, the ways to run
the example (``pyflyte run``, a Python call, ``pyflyte-execute`` as a Flyte pod runs it), and readers
for what they leave (outputs, error documents, the local cache, the run directory)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from tracking.harness import tool_environment

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
EXAMPLE = EXAMPLES / "flyte_workflow.py"
DRIVER = Path(__file__).with_name("flyte_driver.py")
BIN = Path(sys.executable).parent
TIMEOUT = 300  # generous: the machine is shared; a broken run fails long before


def flyte_environment(tmp_path: Path) -> dict[str, str]:
    """flytekit's state (``~/.flyte``: config, local cache; its sandboxes in TMPDIR), W&B's and
    Python's all under ``tmp_path``; no credentials; flytekit's INFO lines ("Cache hit") shown."""
    env = tool_environment(tmp_path / "home")
    env = {k: v for k, v in env.items() if not k.startswith(("FLYTE", "_F_", "PYFLYTE"))}
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env.update(
        TMPDIR=str(tmp_path / "tmp"),
        PYTHONDONTWRITEBYTECODE="1",  # nothing written beside the example
        FLYTE_SDK_LOGGING_LEVEL="20",
        COLUMNS="400",  # flytekit's rich console: no wrapped lines
    )
    return env


def on_module_path(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the example importable as ``flyte_workflow``, as in a task's container image."""
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(EXAMPLES), env.get("PYTHONPATH")]))}


def pyflyte_run(env: dict[str, str], cwd: Path, workflow: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [str(BIN / "pyflyte"), "run", str(EXAMPLE), workflow, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=cwd)


def call_workflow(env: dict[str, str], cwd: Path, workflow: str, **inputs) -> tuple[subprocess.CompletedProcess, dict]:
    """Call ``workflow(**inputs)`` in a Python process; (process, what the driver reported)."""
    cmd = [sys.executable, str(DRIVER), "call", workflow, json.dumps(inputs)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=cwd)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    return proc, (json.loads(lines[-1].removeprefix("RESULT ")) if lines else {})


def write_inputs(env: dict[str, str], path: Path, task: str, **inputs) -> None:
    """The task's inputs as the literal map file ``inputs.pb`` Flyte hands a pod (``--inputs``)."""
    cmd = [sys.executable, str(DRIVER), "inputs", task, json.dumps(inputs), str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@dataclass
class Attempt:
    """One attempt of a task as flytepropeller lays it out: its raw output prefix and, inside it,
    the checkpoint location ``_flytecheckpoints`` the next attempt gets as ``--prev-checkpoint``
    (flyteorg/flyte flytepropeller/pkg/controller/nodes/task/taskexec_context.go,
    ComputePreviousCheckpointPath, and flytekit core/python_auto_container.py's container args)."""

    root: Path

    @property
    def outputs(self) -> Path:
        return self.root / "outputs"

    @property
    def raw(self) -> Path:
        return self.root / "raw"

    @property
    def checkpoint(self) -> Path:
        return self.raw / "_flytecheckpoints"

    def command(self, inputs: Path, task: str, previous: Attempt | None) -> list[str]:
        return [
            str(BIN / "pyflyte-execute"),
            *("--inputs", str(inputs), "--output-prefix", str(self.outputs)),
            *("--raw-output-data-prefix", str(self.raw), "--checkpoint-path", str(self.checkpoint)),
            *("--prev-checkpoint", str(previous.checkpoint) if previous else '""'),
            *("--resolver", "flytekit.core.python_auto_container.default_task_resolver", "--"),
            *("task-module", "flyte_workflow", "task-name", task),
        ]

    def checkpoint_files(self) -> list[str]:
        return sorted(p.name for p in self.checkpoint.glob("ckpt-*.pt")) if self.checkpoint.is_dir() else []


def read_outputs(outputs: Path) -> tuple[list[float], str]:
    """(epoch accuracies, model file URI) from a pod's ``outputs.pb``."""
    from flyteidl.core import literals_pb2

    literals = literals_pb2.LiteralMap()
    literals.ParseFromString((outputs / "outputs.pb").read_bytes())
    accuracies = [
        item.scalar.primitive.float_value for item in literals.literals["epoch_accuracies"].collection.literals
    ]
    return accuracies, literals.literals["model_state"].scalar.blob.uri


def read_error(outputs: Path):
    """The ``ContainerError`` of a pod's ``error.pb`` (what flytepropeller reads to decide on a retry)."""
    from flyteidl.core import errors_pb2

    document = errors_pb2.ErrorDocument()
    document.ParseFromString((outputs / "error.pb").read_bytes())
    return document.error


_OUTPUTS_LINE = re.compile(r"^TrainOutputs\(epoch_accuracies=(\[[^\]]*\]), model_state=(.+)\)$", re.MULTILINE)


def printed_outputs(stdout: str) -> tuple[list[float], str]:
    """(accuracies, model path) from the outputs ``pyflyte run`` prints."""
    match = _OUTPUTS_LINE.search(stdout)
    assert match, stdout[-3000:]
    return json.loads(match.group(1)), match.group(2)


def run_dirs(stdout: str) -> list[Path]:
    """The run directories shoal's rank 0 named (``  output: DIR``), in order."""
    return [Path(p) for p in re.findall(r"^  output: (.+)$", stdout, re.MULTILINE)]


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def load_digits_model(path: str | Path) -> torch.nn.Module:
    """The digits workload's model with the weights in ``path`` (plain state dict, weights only)."""
    from shoal.train.config import TrainConfig
    from shoal.workloads import get_workload

    model = get_workload("digits").build_model(TrainConfig(workload="digits").resolved(), 10)
    model.load_state_dict(torch.load(path, weights_only=True))  # strict: every key, no extra
    return model


def digits_test_accuracy(model: torch.nn.Module) -> float:
    """The model's accuracy on the digits workload's test split, computed here from scratch."""
    from shoal.train.config import TrainConfig
    from shoal.workloads import get_workload

    data = get_workload("digits").load(TrainConfig(workload="digits").resolved(), torch.device("cpu"))
    inputs, targets = data.test
    with torch.no_grad():
        guesses = model.eval()(inputs).argmax(dim=1)
    return (guesses == targets).sum().item() / len(targets)


def same_weights(a: str | Path, b: str | Path) -> bool:
    first, second = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def cache_keys(env: dict[str, str]) -> list[str]:
    """The keys of flytekit's local task cache (flytekit core/local_cache.py: ``~/.flyte/local-cache``,
    a diskcache; key = task name, cache version and a hash of the inputs)."""
    from diskcache import Cache

    directory = Path(env["HOME"]) / ".flyte" / "local-cache"
    if not directory.is_dir():
        return []
    with Cache(str(directory)) as cache:
        return sorted(cache.iterkeys())
