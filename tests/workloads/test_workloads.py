"""Each ready workload loads its real data format from disk and trains through the CLI."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch

from conftest import run_shoal
from shoal.train.config import TrainConfig
from shoal.workloads import get_workload
from shoal.workloads.cifar10 import BATCH_DIR, random_crop_flip


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_mnist_loads_real_files(mnist_root):
    data = get_workload("mnist").load(TrainConfig(workload="mnist", data=str(mnist_root)), torch.device("cpu"))
    x, y = data.train
    assert x.shape == (60000, 1, 28, 28) and y.shape == (60000,)
    assert data.test[0].shape == (10000, 1, 28, 28)
    # The canonical label counts of the test set (see shared/data/mnist/README.md).
    assert torch.bincount(data.test[1]).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert abs(x.mean().item()) < 0.01 and abs(x.std().item() - 1) < 0.01  # standardised


def test_mnist_extracts_gz_only_copy(tmp_path):
    """A copy of just the four distributed .gz files is accepted and extracted in place."""
    from conftest import MNIST_GZ

    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for gz in MNIST_GZ.glob("t10k-*.gz"):
        (raw / gz.name).write_bytes(gz.read_bytes())
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"):
        (raw / name).write_bytes((MNIST_GZ / name).read_bytes())
    get_workload("mnist").prepare(TrainConfig(workload="mnist", data=str(tmp_path)))
    assert (raw / "t10k-labels-idx1-ubyte").stat().st_size == 10008


@pytest.mark.multiprocess
def test_mnist_trains_one_epoch_on_two_workers(mnist_root, tmp_path):
    out = tmp_path / "run"
    result = run_shoal(
        "train",
        "mnist",
        "--data",
        str(mnist_root),
        "--nproc",
        "2",
        "--epochs",
        "1",
        "--batch-size",
        "128",
        "--out",
        str(out),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    (record,) = _metrics(out)
    assert record["samples_seen"] == 60000
    assert record["test_accuracy"] > 0.95


def _fake_cifar(root, train_per_batch=8, test=16):
    """A tiny stand-in in CIFAR-10's real on-disk format (pickled dicts of uint8 rows)."""
    rng = np.random.default_rng(0)
    folder = root / BATCH_DIR
    folder.mkdir(parents=True)

    def batch(n):
        return {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), "labels": rng.integers(0, 10, n).tolist()}

    for i in range(1, 6):
        (folder / f"data_batch_{i}").write_bytes(pickle.dumps(batch(train_per_batch)))
    (folder / "test_batch").write_bytes(pickle.dumps(batch(test)))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"c{i}" for i in range(10)]}))


def test_cifar10_reads_the_pickle_format(tmp_path):
    _fake_cifar(tmp_path)
    cfg = TrainConfig(workload="cifar10", data=str(tmp_path))
    workload = get_workload("cifar10")
    workload.prepare(cfg)
    data = workload.load(cfg, torch.device("cpu"))
    assert data.train[0].shape == (40, 3, 32, 32) and data.train[0].dtype == torch.uint8
    assert data.test[0].shape == (16, 3, 32, 32)
    # Row layout: 1024 red, then green, then blue values, row-major: check one pixel.
    raw = pickle.loads((tmp_path / BATCH_DIR / "data_batch_1").read_bytes())["data"][0]
    assert data.train[0][0, 1, 2, 3].item() == raw[1024 + 2 * 32 + 3]
    images, labels = data.train_transform((data.train[0][:8], data.train[1][:8]))
    assert images.dtype == torch.float32 and images.shape == (8, 3, 32, 32)
    model = workload.build_model(cfg, 10)
    assert model(images).shape == (8, 10)


def test_random_crop_flip_moves_pixels_not_values():
    images = torch.arange(2 * 3 * 32 * 32, dtype=torch.float32).view(2, 3, 32, 32) + 1
    out = random_crop_flip(images, torch.Generator().manual_seed(0))
    assert out.shape == images.shape
    for i in range(2):  # every non-padding value comes from the same image
        values = set(out[i].flatten().tolist()) - {0.0}
        assert values <= set(images[i].flatten().tolist())


@pytest.mark.multiprocess
def test_cifar10_trains_through_the_cli(tmp_path):
    _fake_cifar(tmp_path / "data")
    out = tmp_path / "run"
    result = run_shoal(
        "train",
        "cifar10",
        "--data",
        str(tmp_path / "data"),
        "--nproc",
        "2",
        "--epochs",
        "1",
        "--batch-size",
        "8",
        "--out",
        str(out),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    (record,) = _metrics(out)
    assert record["samples_seen"] == 40 and record["world_size"] == 2


def test_synthetic_reports_throughput(tmp_path):
    out = tmp_path / "run"
    result = run_shoal(
        "train",
        "synthetic",
        "--arch",
        "resnet18",
        "--samples",
        "64",
        "--batch-size",
        "16",
        "--out",
        str(out),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    (record,) = _metrics(out)
    assert record["samples_per_s"] > 0 and record["samples_seen"] == 64
    assert "samples/s" in result.stdout
