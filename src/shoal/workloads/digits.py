"""digits: scikit-learn's bundled 1,797 real 8x8 handwritten digits (works offline), and an MLP."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import torch
from torch import nn

from shoal.errors import ShoalError
from shoal.workloads.base import Workload, WorkloadData, WorkloadSettings

# 357 test images leave 1,440 for training: divisible by 2..6 and 8, so every world size up to 8
# sees whole global batches and runs with different world sizes compare sample for sample.
TEST_SIZE = 357
SPLIT_SEED = 0  # the split is fixed, whatever --seed says, so accuracies compare across runs


class Digits(Workload):
    name = "digits"
    summary = "1,797 real 8x8 handwritten digits bundled with scikit-learn; an MLP (fast, offline)"
    defaults = {"epochs": 20, "batch_size": 32, "lr": 0.05, "optimizer": "sgd", "weight_decay": 1e-4}

    def load(self, cfg: WorkloadSettings, device: torch.device, rank: int = 0) -> WorkloadData:
        images, labels = load_digits_arrays()
        train_idx, test_idx = stratified_split(labels, TEST_SIZE, SPLIT_SEED)
        x_train = torch.as_tensor(images[train_idx], dtype=torch.float32)
        x_test = torch.as_tensor(images[test_idx], dtype=torch.float32)
        # Standardise with the training set's statistics only.
        mean, std = x_train.mean(), x_train.std()
        return WorkloadData(
            train=(((x_train - mean) / std).to(device), torch.as_tensor(labels[train_idx]).to(device)),
            test=(((x_test - mean) / std).to(device), torch.as_tensor(labels[test_idx]).to(device)),
            num_classes=10,
        )

    def display_images(self, inputs: torch.Tensor) -> torch.Tensor:
        return inputs.reshape(-1, 8, 8)  # the 64 features are an 8x8 image, row by row

    def build_model(self, cfg: WorkloadSettings, num_classes: int) -> nn.Module:
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, num_classes))


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(images as float64 [1797, 64], labels as int64 [1797]): what ``sklearn.datasets.load_digits``
    returns, read from the file it reads, without importing scikit-learn.

    Every worker loads the data, and ``import sklearn.datasets`` pulls in SciPy: about 1 s per
    worker, a fifth of ``shoal train digits``' start-up. Falls back to scikit-learn itself if its
    bundled file ever moves.
    """
    path = _bundled_digits_csv()
    if path is None:
        from sklearn.datasets import load_digits

        images, labels = load_digits(return_X_y=True)
        return images, labels.astype(np.int64)
    table = np.loadtxt(path, delimiter=",")
    return table[:, :-1], table[:, -1].astype(np.int64)


def _bundled_digits_csv() -> Path | None:
    """scikit-learn's ``datasets/data/digits.csv.gz``, located without running scikit-learn's code."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None:
        raise ShoalError(
            "the digits workload needs scikit-learn, which is not installed",
            "pip install scikit-learn (it ships the 1,797 digit images), or choose another workload",
        )
    for base in spec.submodule_search_locations or ():
        path = Path(base) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            return path
    return None


def stratified_split(labels: np.ndarray, test_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, test), both sorted: ``test_size`` samples drawn at random with ``seed``, each
    class given its share of the test set (largest remainders), so both sides keep the class balance."""
    classes, counts = np.unique(labels, return_counts=True)
    exact = counts * test_size / len(labels)
    per_class = np.floor(exact).astype(np.int64)
    per_class[np.argsort(per_class - exact, kind="stable")[: test_size - per_class.sum()]] += 1
    rng = np.random.default_rng(seed)
    test = np.sort(
        np.concatenate([rng.permutation(np.flatnonzero(labels == c))[:k] for c, k in zip(classes, per_class)])
    )
    return np.setdiff1d(np.arange(len(labels)), test), test
