"""Run by the Flyte tests in a process of its own (flytekit's state stays in that process's HOME).

python flyte_driver.py call WORKFLOW '{"epochs": 2}'          call the example's workflow, print RESULT {...}
python flyte_driver.py inputs TASK '{"epochs": 2}' OUT.pb     write the task's inputs as Flyte's literal map
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import flyte_workflow
from flytekit.core.context_manager import FlyteContextManager
from flytekit.core.type_engine import TypeEngine
from flytekit.types.file import FlyteFile


def call(workflow: str, inputs: dict) -> None:
    outputs = getattr(flyte_workflow, workflow)(**inputs)
    print(
        "RESULT "
        + json.dumps(
            {
                "type": type(outputs).__name__,
                "fields": list(outputs._fields),
                "accuracies": outputs.epoch_accuracies,
                "accuracy_types": sorted({type(a).__name__ for a in outputs.epoch_accuracies}),
                "accuracies_type": type(outputs.epoch_accuracies).__name__,
                "model_is_flyte_file": isinstance(outputs.model_state, FlyteFile),
                "model_path": os.fspath(outputs.model_state),  # a local copy of the file
            }
        ),
        flush=True,
    )


def write_inputs(task: str, inputs: dict, path: str) -> None:
    hints = getattr(flyte_workflow, task).python_interface.inputs
    literals = TypeEngine.dict_to_literal_map(FlyteContextManager.current_context(), inputs, hints)
    Path(path).write_bytes(literals.to_flyte_idl().SerializeToString())


if __name__ == "__main__":
    command, name, values = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    if command == "call":
        call(name, values)
    else:
        write_inputs(name, values, sys.argv[4])
