"""Call a workflow of examples/flyte_own_model.py in this process, under real flytekit (local execution).

python flyte_own_model_driver.py WORKFLOW '{"hp": {...}, "data_dir": "...", ...}' [SAMPLES]
    prints RESULT {...}; with SAMPLES, also the guesses of the Net loaded afresh from the model file
    the workflow returned (its workers trained it, in processes of their own) on the first SAMPLES
    test images of DATA_DIR, and their labels (one interpreter for both: flytekit and torch load once)
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import flyte_own_model
from flytekit.types.file import FlyteFile


def score(model_file: str, data_dir: str, samples: int) -> dict:
    """The guesses of a new Net with the file's weights on the first ``samples`` test images, and their labels."""
    import torch

    model = flyte_own_model.Net()
    model.load_state_dict(torch.load(model_file, weights_only=True))  # strict: the Net's keys, no DDP prefix
    images, labels = zip(*flyte_own_model.mnist(data_dir, False, samples))
    with torch.no_grad():
        outputs = torch.cat([model.eval()(batch) for batch in torch.stack(images).split(100)])
    return {"guesses": outputs.argmax(dim=1).tolist(), "labels": list(labels)}


if __name__ == "__main__":
    workflow, inputs = sys.argv[1], json.loads(sys.argv[2])
    data_dir = inputs["data_dir"]
    if "hp" in inputs:
        inputs["hp"] = flyte_own_model.Hyperparameters(**inputs["hp"])
    outputs = getattr(flyte_own_model, workflow)(**inputs)
    report = {
        "accuracies": list(outputs.epoch_accuracies),
        "model_is_flyte_file": isinstance(outputs.model_state, FlyteFile),
        "model_path": os.fspath(outputs.model_state),  # a local copy of the file
    }
    if len(sys.argv) > 3:
        report.update(score(report["model_path"], data_dir, int(sys.argv[3])))
    print("RESULT " + json.dumps(report), flush=True)
