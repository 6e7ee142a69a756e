"""Source of user workloads written into a test's tmp_path: a real file outside the package."""

from __future__ import annotations

from pathlib import Path

GOOD = '''
import torch
from torch import nn
from torch.utils.data import Dataset

import shoal


class Blobs(Dataset):
    """Three Gaussian blobs, one (features, label) per __getitem__: a Dataset, not tensors."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.y = torch.randint(0, 3, (n,), generator=g)
        self.x = torch.randn(n, 4, generator=g) + self.y[:, None].float() * 2

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Tiny(shoal.Workload):
    defaults = {"epochs": 2, "batch_size": 8, "lr": 0.1}

    def __init__(self, hidden=16):
        self.hidden = hidden

    def load(self, cfg, device, rank=0):
        return shoal.WorkloadData(train=Blobs(96, 0), test=Blobs(30, 1), num_classes=3)

    def build_model(self, cfg, num_classes):
        return nn.Sequential(nn.Linear(4, self.hidden), nn.ReLU(), nn.Linear(self.hidden, num_classes))


class Regression(Tiny):
    """Its own loss and metric (mean squared error; the sum of absolute errors per batch) and its
    own collate_fn, which makes the targets floats."""

    defaults = {"epochs": 1, "batch_size": 8, "lr": 0.01}

    def load(self, cfg, device, rank=0):
        data = super().load(cfg, device, rank)
        data.loader_options = {"collate_fn": collate_as_floats}
        return data

    def build_model(self, cfg, num_classes):
        return nn.Sequential(nn.Linear(4, 1), nn.Flatten(0))

    def loss(self, outputs, targets):
        assert targets.dtype == torch.float32, "collate_fn was not used"
        return nn.functional.mse_loss(outputs, targets)

    def metrics(self, outputs, targets):
        return {"abs_error": (outputs - targets).abs().sum()}


def collate_as_floats(items):
    inputs, targets = torch.utils.data.default_collate(items)
    return inputs, targets.float()


class OneTestSample(Regression):
    """A test set of one sample: on 2 ranks, rank 1 evaluates nothing and must still agree on the
    metrics' names."""

    def load(self, cfg, device, rank=0):
        data = super().load(cfg, device, rank)
        data.test = torch.utils.data.Subset(data.test, [0])
        return data


class Pictures(Tiny):
    """Tiny, with class names and its 4 features shown as a 2x2 picture in the predictions table."""

    class_names = ("low", "middle", "high")

    def display_images(self, inputs):
        return inputs.reshape(-1, 2, 2)


tiny = Tiny(hidden=8)


def make_tiny():
    return Tiny(hidden=12)
'''

BAD = """
import torch
from torch import nn
from torch.utils.data import Dataset

import shoal


class Raising(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        raise ValueError(f"cannot read sample {i}")


class Good(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.randn(4), i % 3


class BadData(shoal.Workload):
    defaults = {"epochs": 1, "batch_size": 4}

    def load(self, cfg, device, rank=0):
        return shoal.WorkloadData(train=Raising(), test=Raising(), num_classes=3)

    def build_model(self, cfg, num_classes):
        return nn.Linear(4, 3)


class Misfit(BadData):
    def load(self, cfg, device, rank=0):
        return shoal.WorkloadData(train=Good(), test=Good(), num_classes=3)

    def build_model(self, cfg, num_classes):
        return nn.Linear(4, 1)  # one output, but the targets are class indices 0..2


class WrongInput(Misfit):
    def build_model(self, cfg, num_classes):
        return nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))  # the data has 4 features


NOT_A_WORKLOAD = 3


def not_a_factory():
    return "a string"
"""


def line_of(source: str, text: str) -> int:
    """The 1-based line of ``source`` holding ``text``."""
    return next(i for i, line in enumerate(source.splitlines(), 1) if text in line)


def write(directory: Path, name: str, source: str) -> Path:
    path = directory / name
    path.write_text(source)
    return path
