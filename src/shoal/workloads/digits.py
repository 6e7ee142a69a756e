"""digits: scikit-learn's bundled 1,797 real 8x8 handwritten digits (works offline), and an MLP."""

from __future__ import annotations

import torch
from torch import nn

from shoal.train.config import TrainConfig
from shoal.workloads.base import Workload, WorkloadData

# 357 test images leave 1,440 for training: divisible by 2..6 and 8, so every world size up to 8
# sees whole global batches and runs with different world sizes compare sample for sample.
TEST_SIZE = 357
SPLIT_SEED = 0  # the split is fixed, whatever --seed says, so accuracies compare across runs


class Digits(Workload):
    name = "digits"
    summary = "1,797 real 8x8 handwritten digits bundled with scikit-learn; an MLP (fast, offline)"
    defaults = {"epochs": 20, "batch_size": 32, "lr": 0.05, "optimizer": "sgd", "weight_decay": 1e-4}

    def load(self, cfg: TrainConfig, device: torch.device, rank: int = 0) -> WorkloadData:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        images, labels = load_digits(return_X_y=True)
        x_train, x_test, y_train, y_test = train_test_split(
            images, labels, test_size=TEST_SIZE, random_state=SPLIT_SEED, stratify=labels
        )
        x_train = torch.as_tensor(x_train, dtype=torch.float32)
        x_test = torch.as_tensor(x_test, dtype=torch.float32)
        # Standardise with the training set's statistics only.
        mean, std = x_train.mean(), x_train.std()
        return WorkloadData(
            train=(((x_train - mean) / std).to(device), torch.as_tensor(y_train).long().to(device)),
            test=(((x_test - mean) / std).to(device), torch.as_tensor(y_test).long().to(device)),
            num_classes=10,
        )

    def build_model(self, cfg: TrainConfig, num_classes: int) -> nn.Module:
        return nn.Sequential(
            nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, num_classes)
        )
