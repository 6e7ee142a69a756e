"""Call a workflow of examples/flyte_own_model.py in this process, under real flytekit (local execution).

python flyte_own_model_driver.py WORKFLOW '{"hp": {...}, "data_dir": "...", ...}'   prints RESULT {...}
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))

import flyte_own_model
from flytekit.types.file import FlyteFile

if __name__ == "__main__":
    workflow, inputs = sys.argv[1], json.loads(sys.argv[2])
    if "hp" in inputs:
        inputs["hp"] = flyte_own_model.Hyperparameters(**inputs["hp"])
    outputs = getattr(flyte_own_model, workflow)(**inputs)
    report = {
        "accuracies": list(outputs.epoch_accuracies),
        "model_is_flyte_file": isinstance(outputs.model_state, FlyteFile),
        "model_path": os.fspath(outputs.model_state),  # a local copy of the file
    }
    print("RESULT " + json.dumps(report), flush=True)
