"""Call a workflow of examples/flyte_own_model.py in this process, under real flytekit (local execution).

python flyte_own_model_driver.py WORKFLOW '{"hp": {...}, "data_dir": "...", ...}'   prints RESULT {...}
python flyte_own_model_driver.py score MODEL.pt DATA_DIR SAMPLES    the saved Net's guesses on the first
                                                                    SAMPLES test images, and their labels
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))

import flyte_own_model
from flytekit.types.file import FlyteFile


def score(model_file: str, data_dir: str, samples: int) -> None:
    import torch

    model = flyte_own_model.Net()
    model.load_state_dict(torch.load(model_file, weights_only=True))  # strict: the Net's keys, no DDP prefix
    images, labels = zip(*flyte_own_model.mnist(data_dir, False, samples))
    with torch.no_grad():
        outputs = torch.cat([model.eval()(batch) for batch in torch.stack(images).split(100)])
    print("RESULT " + json.dumps({"guesses": outputs.argmax(dim=1).tolist(), "labels": list(labels)}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "score":
        score(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        sys.exit(0)
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
