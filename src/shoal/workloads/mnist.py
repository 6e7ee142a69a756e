"""mnist: torchvision's MNIST from ``--data DIR`` (or ``--download``), held in memory, and a small CNN."""

from __future__ import annotations

import torch
from torch import nn

from shoal.workloads.base import Workload, WorkloadData, WorkloadSettings, check_or_download, data_root

RAW_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
MEAN, STD = 0.1307, 0.3081  # the canonical MNIST statistics
LAYOUT = "the files in DIR/MNIST/raw"


class MNIST(Workload):
    name = "mnist"
    summary = "MNIST 28x28 digits from --data DIR (torchvision layout DIR/MNIST/raw); a small CNN"
    defaults = {"epochs": 4, "batch_size": 64, "lr": 4e-3, "optimizer": "adamw", "weight_decay": 1e-4}

    def prepare(self, cfg: WorkloadSettings) -> None:
        root = data_root(cfg, LAYOUT)
        raw = root / "MNIST" / "raw"
        missing = [name for name in RAW_FILES if not (raw / name).is_file()]
        if not missing:
            return
        gz_present = [name for name in missing if (raw / f"{name}.gz").is_file()]
        if len(gz_present) == len(missing):
            # torchvision leaves the downloaded .gz files beside the extracted ones; a copy of just
            # the .gz files (as distributed) is extracted in place, as its download would do.
            from torchvision.datasets.utils import extract_archive

            for name in gz_present:
                extract_archive(str(raw / f"{name}.gz"), str(raw))
            return

        def download() -> None:
            from torchvision.datasets import MNIST as TorchvisionMNIST

            TorchvisionMNIST(str(root), train=True, download=True)
            TorchvisionMNIST(str(root), train=False, download=True)

        check_or_download(
            cfg,
            title="MNIST",
            where=raw,
            missing=missing,
            download=download,
            put_hint="put the four MNIST files (optionally .gz) in DIR/MNIST/raw",
        )

    def load(self, cfg: WorkloadSettings, device: torch.device, rank: int = 0) -> WorkloadData:
        from torchvision.datasets import MNIST as TorchvisionMNIST

        root = str(data_root(cfg, LAYOUT))
        train = TorchvisionMNIST(root, train=True, download=False)
        test = TorchvisionMNIST(root, train=False, download=False)
        return WorkloadData(
            train=(_normalise(train.data).to(device), train.targets.long().to(device)),
            test=(_normalise(test.data).to(device), test.targets.long().to(device)),
            num_classes=10,
        )

    def build_model(self, cfg: WorkloadSettings, num_classes: int) -> nn.Module:
        # 20k parameters, ~1 M multiply-adds per image: 99.0-99.2% test accuracy in 3-4 epochs. In
        # channels-last memory (the trainer's default for conv models) oneDNN runs it ~1.6x faster
        # on CPU than in NCHW; docs/BENCHMARKS.md ("Time to accuracy") has the numbers.
        return nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 28 -> 14
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 14 -> 7
            nn.Flatten(),
            nn.Linear(32 * 7 * 7, num_classes),
        )


def _normalise(images: torch.Tensor) -> torch.Tensor:
    """uint8 N x 28 x 28 -> standardised float N x 1 x 28 x 28, once, up front."""
    return ((images.float() / 255.0 - MEAN) / STD).unsqueeze(1).contiguous()
