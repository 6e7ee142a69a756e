"""The Tanzu lab's own job: its Keras + Horovod script in MPIJob pods, as the MPI operator runs it.

The same simulation as test_mpijob_pods.py (the MPIJob shoal renders, the pods the operator makes of
it, real sshd in each worker pod, the launcher's mpirun over SSH), running
examples/horovod_keras_mobilenet.py (a Keras MobileNetV2 with the lab's seven steps, on
``shoal.horovod.tensorflow.keras``): one rank in each worker pod, the trainable weights
bit-identical on both, checkpoints on the claim written by rank 0 only.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_mpijob_pods import SHARED, _run_mpijob, can_make_pods  # noqa: F401  (can_make_pods: a fixture)
from test_mpijob_pods import pytestmark as pods_marks

pytestmark = [*pods_marks, pytest.mark.slow, pytest.mark.timeout(600)]

LAB = str(Path(__file__).resolve().parents[2] / "examples" / "horovod_keras_mobilenet.py")


def test_mpijob_pods_train_the_labs_keras_mobilenet(tmp_path, can_make_pods):  # noqa: F811
    command = ("env", "TF_CPP_MIN_LOG_LEVEL=2", "python", LAB, "--out", f"{SHARED}/checkpoints",
               "--report", SHARED, "--epochs", "2", "--images", "32", "--batch-size", "4")  # fmt: skip
    status, output, shared, job = _run_mpijob(tmp_path, "keras", command)
    assert status == 0, output
    ranks = [json.loads((shared / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(r["rank"], r["size"]) for r in ranks] == [(0, 2), (1, 2)]
    assert ranks[0]["trainable_digest"] == ranks[1]["trainable_digest"]  # one model in both pods
    assert ranks[1]["checkpoints"] == []  # step 7: rank 0 only
    assert sorted(p.name for p in (shared / "checkpoints").iterdir()) == ["checkpoint-1.keras", "checkpoint-2.keras"]
    assert ranks[0]["checkpoint_digest"] == ranks[0]["trainable_digest"]
    assert job.launcher.argv[:3] == ["mpirun", "-np", "2"]
