"""synthetic: random images through any torchvision ResNet or a small MLP, to measure throughput (no data needed)."""

from __future__ import annotations

import torch
from torch import nn

from shoal.workloads.archs import check_arch
from shoal.workloads.base import Workload, WorkloadData, WorkloadSettings

MLP_WIDTH = 512
NUM_CLASSES = 10
DEFAULT_SAMPLES = 1024


class Synthetic(Workload):
    name = "synthetic"
    summary = "random 3xSxS inputs through a torchvision ResNet or an MLP (--arch, --image-size); reports samples/s"
    defaults = {"epochs": 1, "batch_size": 32, "lr": 0.01, "optimizer": "sgd", "weight_decay": 0.0}

    def prepare(self, cfg: WorkloadSettings) -> None:
        check_arch(self.name, cfg.arch)

    def load(self, cfg: WorkloadSettings, device: torch.device, rank: int = 0) -> WorkloadData:
        samples = cfg.samples or DEFAULT_SAMPLES
        test_samples = max(1, samples // 8)
        generator = torch.Generator().manual_seed(cfg.seed)
        shape = (3, cfg.image_size, cfg.image_size)

        def make(n: int) -> tuple[torch.Tensor, torch.Tensor]:
            images = torch.randn((n, *shape), generator=generator)
            labels = torch.randint(0, NUM_CLASSES, (n,), generator=generator)
            return images.to(device), labels.to(device)

        return WorkloadData(train=make(samples), test=make(test_samples), num_classes=NUM_CLASSES)

    def build_model(self, cfg: WorkloadSettings, num_classes: int) -> nn.Module:
        return build_synthetic_model(cfg.arch, cfg.image_size, num_classes)


def build_synthetic_model(arch: str, image_size: int, num_classes: int = NUM_CLASSES) -> nn.Module:
    """A torchvision ResNet, or ``mlp``: 3xSxS inputs flattened, two hidden layers of 512, ReLU.

    The MLP is the "tiny model" of the overhead benchmark: so little compute per step that any
    per-step cost of the training loop (or of the gradient all-reduce) shows.
    """
    check_arch("synthetic", arch)
    if arch == "mlp":
        features = 3 * image_size * image_size
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(features, MLP_WIDTH),
            nn.ReLU(),
            nn.Linear(MLP_WIDTH, MLP_WIDTH),
            nn.ReLU(),
            nn.Linear(MLP_WIDTH, num_classes),
        )
    import torchvision.models

    return getattr(torchvision.models, arch)(num_classes=num_classes)
