"""A Horovod-style training script (``import shoal.horovod as hvd``) under every launcher, unchanged.

The script (scripts/hvd_tutorial.py) follows the Horovod tutorial's seven steps on scikit-learn's
bundled digits. On CPU with one thread per rank the arithmetic is deterministic, so the same job of
2 ranks must end with bit-identical weights whichever launcher started it: torchrun is the
reference, mpirun, ``shoal run`` and srun must reproduce its digest. Resuming from rank 0's
checkpoint under ``shoal run`` must give exactly the weights of the uninterrupted run
(broadcast_parameters and broadcast_optimizer_state hand rank 0's model and momentum buffers to the
other rank): that run is also ``shoal run``'s reproduction of the digest.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch
from horovod_launch import TUTORIAL, check, clean_env, needs_mpirun, results, run

from shoal.launch.ports import find_free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster_slurm"))

pytestmark = pytest.mark.multiprocess

EPOCHS = "2"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The tutorial for 2 epochs on 2 ranks under torchrun: its output and rank results."""
    out = tmp_path_factory.mktemp("torchrun")
    proc = run("torchrun", 2, TUTORIAL, "--out", str(out), "--epochs", EPOCHS)
    check(proc)
    return {"out": out, "stdout": proc.stdout, "ranks": results(out, 2)}


def _check_job(ranks: list[dict], size: int) -> None:
    assert [r["rank"] for r in ranks] == list(range(size))
    assert [(r["size"], r["local_rank"], r["local_size"], r["cross_rank"], r["cross_size"]) for r in ranks] == [
        (size, rank, size, 0, 1) for rank in range(size)
    ]
    assert len({r["weights"] for r in ranks}) == 1, "the ranks ended with different weights"
    assert [r["lr"] for r in ranks] == pytest.approx([0.05 * size] * size)  # step 3: lr scaled by hvd.size()


def test_torchrun_trains_in_step_and_checkpoints_on_rank_0(reference):
    ranks = reference["ranks"]
    _check_job(ranks, 2)
    assert ranks[0]["accuracies"] == ranks[1]["accuracies"]  # the averaged metric, the same on both
    assert ranks[0]["accuracies"][-1] > 0.8, ranks[0]["accuracies"]
    assert sorted(p.name for p in reference["out"].glob("checkpoint-*.pt")) == ["checkpoint-1.pt", "checkpoint-2.pt"]
    assert reference["stdout"].count("epoch 2: test accuracy") == 1  # printed by rank 0 only
    saved = torch.load(reference["out"] / "checkpoint-2.pt", weights_only=True)
    assert saved["epoch"] == 2 and len(saved["optimizer"]["state"]) == 8  # momentum for all 8 tensors


@needs_mpirun
def test_mpirun_gives_the_same_weights(reference, tmp_path):
    # shoal run's digest: test_resume_from_rank_0s_checkpoint_is_exact (its resumed run under shoal run).
    check(run("mpirun", 2, TUTORIAL, "--out", str(tmp_path), "--epochs", EPOCHS))
    ranks = results(tmp_path, 2)
    _check_job(ranks, 2)
    assert ranks[0]["weights"] == reference["ranks"][0]["weights"]


def test_srun_gives_the_same_weights(reference, slurm, tmp_path):
    # A free port: shoal's Slurm default (15000 + job id % 5000) repeats across the fresh test clusters
    # that other sessions on this machine may be running at the same time (each starts at job 1).
    env = clean_env(SLURM_CONF=slurm.env["SLURM_CONF"], MASTER_PORT=str(find_free_port()))
    proc = run("srun", 2, TUTORIAL, "--out", str(tmp_path), "--epochs", EPOCHS, env=env)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{slurm.logs()}"
    ranks = results(tmp_path, 2)
    _check_job(ranks, 2)
    assert ranks[0]["weights"] == reference["ranks"][0]["weights"]


def test_plain_python_is_a_job_of_one(tmp_path):
    proc = run("python", 1, TUTORIAL, "--out", str(tmp_path), "--epochs", EPOCHS)
    check(proc)
    (only,) = results(tmp_path, 1)
    assert (only["size"], only["local_size"], only["cross_size"], only["rank"]) == (1, 1, 1, 0)
    assert only["accuracies"][-1] > 0.8 and only["lr"] == pytest.approx(0.05)


def test_resume_from_rank_0s_checkpoint_is_exact(reference, tmp_path):
    """2 epochs straight (the reference, under torchrun), against 1 epoch (the reference's checkpoint) + 1
    resumed under shoal run: the same job (ranks, sizes, scaled lr) and the reference's digest, which
    is also what shows ``shoal run`` reproducing torchrun's arithmetic."""
    # Only rank 0 reads the checkpoint; the broadcasts give rank 1 the model and the momentum buffers.
    shutil.copy(reference["out"] / "checkpoint-1.pt", tmp_path / "checkpoint-1.pt")
    check(run("shoal-run", 2, TUTORIAL, "--out", str(tmp_path), "--epochs", EPOCHS))
    after = results(tmp_path, 2)
    _check_job(after, 2)
    assert [r["resumed_from"] for r in after] == [1, 1]
    assert [r["momentum_buffers"] for r in after] == [8, 8]
    assert {r["weights"] for r in after} == {reference["ranks"][0]["weights"]}


def test_fp16_compression_and_local_accumulation_still_train(tmp_path):
    proc = run(
        "torchrun",
        2,
        TUTORIAL,
        "--out",
        str(tmp_path),
        "--epochs",
        "3",
        "--fp16-allreduce",
        "--batches-per-allreduce",
        "2",
    )
    check(proc)
    ranks = results(tmp_path, 2)
    assert len({r["weights"] for r in ranks}) == 1
    assert ranks[0]["accuracies"][-1] > 0.8, ranks[0]["accuracies"]
