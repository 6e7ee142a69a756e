"""The Tanzu lab's own job: its unchanged Keras + Horovod script in MPIJob pods, as the MPI operator runs it.

The same simulation as test_mpijob_pods.py (the MPIJob shoal renders, the pods the operator makes of
it, real sshd in each worker pod, the launcher's plain ``mpirun -np 2`` over SSH), running
examples/horovod_keras_mobilenet.py (a Keras MobileNetV2 with the lab's seven steps) with the lab's
own line back (``import horovod.tensorflow.keras as hvd``) and shoal's opt-in, from what ``shoal launch
k8s --kind mpijob --horovod-shim --dry-run`` prints: no path set by hand, the launcher's mpirun hands
each rank ``SHOAL_HOROVOD_SHIM=1`` (``-x``) and each rank's ``shoal.launch.as_torchrun`` puts the shim
of the shoal installed in its pod first on its PYTHONPATH. One rank in each
worker pod: the trainable weights bit-identical on both (batch-norm statistics stay per rank, as with
Horovod), the averaged metrics the same, the learning rate warmed up to 0.01 x hvd.size(),
checkpoints on the claim written by rank 0 only, the last one reloaded with ``hvd.load_model``.

The lab runs once in the suite, here: its cost is fixed (each rank builds and traces MobileNetV2's
training step; one epoch of 8 images costs what two of 32 do), and each part of the other places it
could run is proven on its own: ``shoal launch --via mpirun`` with client scripts (tests/clients),
the Horovod API under torchrun, mpirun, srun and ``shoal run`` (tests/horovod), the TF binding
under torchrun (test_horovod_tf_api.py). The equality with one process on the global batch is
checked on a model without batch norm (test_horovod_tf_api.py): batch norm's per-rank batch
statistics make the two differ, in Horovod too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_mpijob_pods import NAMESPACE, SHARED, _run_mpijob, can_make_pods  # noqa: F401  (can_make_pods: a fixture)
from test_mpijob_pods import pytestmark as pods_marks

from conftest import run_shoal

pytestmark = [*pods_marks, pytest.mark.slow, pytest.mark.timeout(600)]

LAB = Path(__file__).resolve().parents[2] / "examples" / "horovod_keras_mobilenet.py"
SHOAL_IMPORT = "import shoal.horovod.tensorflow.keras as hvd  # was: import horovod.tensorflow.keras as hvd"


def test_mpijob_pods_train_the_labs_unchanged_keras_mobilenet_with_the_opt_in(tmp_path, can_make_pods):  # noqa: F811
    source = LAB.read_text()
    assert SHOAL_IMPORT in source  # the shipped script differs from the lab's by this line only
    unchanged = tmp_path / "lab.py"  # /tmp is the pods' too (cluster.pods: only /run is their own)
    unchanged.write_text(source.replace(SHOAL_IMPORT, "import horovod.tensorflow.keras as hvd"))
    command = ("env", "TF_CPP_MIN_LOG_LEVEL=2", "python", str(unchanged), "--out", f"{SHARED}/checkpoints",
               "--report", SHARED, "--epochs", "2", "--images", "32", "--batch-size", "4")  # fmt: skip
    rendered = run_shoal(
        "launch", "k8s", "--kind", "mpijob", "--name", "keras", "--namespace", NAMESPACE, "--image", "shoal:test",
        "--nnodes", "2", "--nproc", "1", "--volume", f"shared:{SHARED}", "--horovod-shim", "--dry-run", "--", *command,
    )  # fmt: skip
    assert rendered.returncode == 0 and rendered.stderr == "", rendered.stderr
    assert "PYTHONPATH" not in rendered.stdout and "shim" not in rendered.stdout  # no path of this machine
    manifest = [doc for doc in yaml.safe_load_all(rendered.stdout) if doc][-1]
    status, output, shared, job = _run_mpijob(tmp_path, "keras", command, manifest=manifest)
    assert status == 0, output
    assert job.launcher.argv[:3] == ["mpirun", "-np", "2"]
    assert "SHOAL_HOROVOD_SHIM" in job.launcher.argv  # -x SHOAL_HOROVOD_SHIM, set on the launcher
    ranks = [json.loads((shared / f"rank{r}.json").read_text()) for r in range(2)]
    module = "shoal.horovod.tensorflow.keras"  # the shim handed the lab's import shoal's module
    assert [(r["rank"], r["size"], r["module"]) for r in ranks] == [(0, 2, module), (1, 2, module)]
    assert ranks[0]["trainable_digest"] == ranks[1]["trainable_digest"]  # one model in both pods
    assert ranks[0]["history"] == ranks[1]["history"]  # MetricAverageCallback
    assert [r["lr"] for r in ranks] == pytest.approx([0.02, 0.02])  # 0.01 x hvd.size(), after the warm-up
    # Step 7: rank 0 alone wrote checkpoints, one per epoch; the last reloads to the final weights.
    assert ranks[1]["checkpoints"] == []
    assert [Path(p).name for p in ranks[0]["checkpoints"]] == ["checkpoint-1.keras", "checkpoint-2.keras"]
    assert sorted(p.name for p in (shared / "checkpoints").iterdir()) == ["checkpoint-1.keras", "checkpoint-2.keras"]
    assert ranks[0]["checkpoint_digest"] == ranks[0]["trainable_digest"]
    assert ranks[0]["restored_optimizer"] == ["SGD", 8]  # 2 epochs x 4 batches, its state kept
