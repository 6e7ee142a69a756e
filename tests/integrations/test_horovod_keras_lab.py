"""The Tanzu lab's Keras script (examples/horovod_keras_mobilenet.py) on 2 ranks under shoal launch.

A Keras MobileNetV2 (``keras.applications``, ``weights=None``) on images made offline, with the
lab's seven steps. Under ``shoal launch --hosts ... --via mpirun`` the lab's own unchanged line
(``import horovod.tensorflow.keras as hvd``) with shoal's opt-in (the shim first on PYTHONPATH); the
script as shipped runs under a plain ``mpirun -np 2`` in tests/cluster_mpi/test_mpijob_keras.py (the
MPI operator's launcher, over SSH into the worker pods), so it is not run a third time here. Each run:
the trainable weights bit-identical on both ranks (batch-norm statistics stay per rank, as with
Horovod), checkpoints written by rank 0 only, the last one reloaded with ``hvd.load_model``. The
equality with one process on the global batch is checked on a model without batch norm
(test_horovod_tf_api.py): batch norm's per-rank batch statistics make the two differ, in Horovod too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from horovod_launch import check, clean_env, needs_mpirun, results

from shoal.horovod.shim import path as shim_path

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, needs_mpirun, pytest.mark.timeout(600)]

LAB = Path(__file__).resolve().parents[2] / "examples" / "horovod_keras_mobilenet.py"
SHOAL_IMPORT = "import shoal.horovod.tensorflow.keras as hvd  # was: import horovod.tensorflow.keras as hvd"
LAB_ARGS = ("--epochs", "2", "--images", "32", "--batch-size", "4")


def check_lab(out: Path, module: str) -> None:
    ranks = results(out, 2)
    assert [(r["rank"], r["size"], r["module"]) for r in ranks] == [(0, 2, module), (1, 2, module)]
    assert ranks[0]["trainable_digest"] == ranks[1]["trainable_digest"]  # one model on both ranks
    assert ranks[0]["history"] == ranks[1]["history"]  # MetricAverageCallback
    assert [r["lr"] for r in ranks] == pytest.approx([0.02, 0.02])  # 0.01 x hvd.size(), after the warm-up
    # Step 7: rank 0 alone wrote checkpoints, one per epoch; the last reloads to the final weights.
    assert ranks[1]["checkpoints"] == []
    assert [Path(p).name for p in ranks[0]["checkpoints"]] == ["checkpoint-1.keras", "checkpoint-2.keras"]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["checkpoint-1.keras", "checkpoint-2.keras"]
    assert ranks[0]["checkpoint_digest"] == ranks[0]["trainable_digest"]
    assert ranks[0]["restored_optimizer"] == ["SGD", 8]  # 2 epochs x 4 batches, its state kept


def test_the_unchanged_lab_under_shoal_launch_with_the_opt_in(tmp_path):
    source = LAB.read_text()
    assert SHOAL_IMPORT in source
    unchanged = tmp_path / "lab.py"
    unchanged.write_text(source.replace(SHOAL_IMPORT, "import horovod.tensorflow.keras as hvd"))
    env = clean_env(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=shim_path())
    argv = [sys.executable, "-m", "shoal", "launch", "--hosts", "localhost:2", "--via", "mpirun",
            "--env", "PYTHONPATH", "--env", "TF_CPP_MIN_LOG_LEVEL", "--",
            str(unchanged), "--out", str(tmp_path / "checkpoints"), "--report", str(tmp_path), *LAB_ARGS]  # fmt: skip
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=480)
    check(proc)
    check_lab(tmp_path, "shoal.horovod.tensorflow.keras")  # the shim handed the script shoal's module
