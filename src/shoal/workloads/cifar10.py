"""cifar10: torchvision's CIFAR-10 from ``--data DIR``, in memory, and a ResNet (``--arch``, default
ResNet-18) with the CIFAR stem and a 10-class head."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from shoal.workloads.archs import check_arch
from shoal.workloads.base import Workload, WorkloadData, WorkloadSettings, check_or_download, data_root

BATCH_DIR = "cifar-10-batches-py"
FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch", "batches.meta")
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
LAYOUT = "DIR/cifar-10-batches-py"


class CIFAR10(Workload):
    name = "cifar10"
    summary = "CIFAR-10 32x32 colour images from --data DIR (DIR/cifar-10-batches-py); ResNet-18 (--arch)"
    defaults = {
        "epochs": 30,
        "batch_size": 128,
        "lr": 0.1,
        "optimizer": "sgd",
        "weight_decay": 5e-4,
        "warmup_epochs": 1.0,
    }

    class_names = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

    def prepare(self, cfg: WorkloadSettings) -> None:
        check_arch(self.name, cfg.arch)
        root = data_root(cfg, LAYOUT)
        missing = [name for name in FILES if not (root / BATCH_DIR / name).is_file()]

        def download() -> None:
            from torchvision.datasets import CIFAR10 as TorchvisionCIFAR10

            TorchvisionCIFAR10(str(root), train=True, download=True)

        check_or_download(
            cfg,
            title="CIFAR-10",
            where=root / BATCH_DIR,
            missing=missing,
            download=download,
            put_hint="unpack cifar-10-python.tar.gz into DIR (giving DIR/cifar-10-batches-py)",
        )

    def load(self, cfg: WorkloadSettings, device: torch.device, rank: int = 0) -> WorkloadData:
        root = str(data_root(cfg, LAYOUT))
        train, test = _read_split(root, train=True), _read_split(root, train=False)
        mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
        std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255
        generator = torch.Generator(device=device).manual_seed(cfg.seed * 1000 + rank)  # differs per rank

        def normalise(batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
            images, labels = batch
            return (images.float() - mean) / std, labels

        def augment(batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
            images, labels = normalise(batch)
            return random_crop_flip(images, generator), labels

        return WorkloadData(
            train=(_to_tensor(train.data, device), torch.as_tensor(train.targets, device=device).long()),
            test=(_to_tensor(test.data, device), torch.as_tensor(test.targets, device=device).long()),
            num_classes=10,
            train_transform=augment,
            test_transform=normalise,
            generator=generator,
        )

    def build_model(self, cfg: WorkloadSettings, num_classes: int) -> nn.Module:
        return cifar_resnet(cfg.arch, num_classes)


def cifar_resnet(arch: str = "resnet18", num_classes: int = 10) -> nn.Module:
    """torchvision's ResNet ``arch`` with the usual CIFAR stem: a 3x3 stride-1 first conv, no max-pool.

    The ImageNet stem shrinks a 32x32 image to 8x8 before the first block and costs about 10
    points of accuracy on CIFAR-10.
    """
    import torchvision.models

    check_arch("cifar10", arch)
    model = getattr(torchvision.models, arch)(num_classes=num_classes)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


def random_crop_flip(images: torch.Tensor, generator: torch.Generator, padding: int = 4) -> torch.Tensor:
    """The standard CIFAR augmentation on a whole batch: random 32x32 crop of the padded image, and
    a horizontal flip with probability 1/2, drawn per image from ``generator``."""
    n, _, h, w = images.shape
    padded = nn.functional.pad(images, (padding,) * 4)
    dy = torch.randint(0, 2 * padding + 1, (n,), generator=generator, device=images.device)
    dx = torch.randint(0, 2 * padding + 1, (n,), generator=generator, device=images.device)
    cropped = _crop(padded, dy, dx, h, w)
    flip = torch.rand(n, generator=generator, device=images.device) < 0.5
    return torch.where(flip.view(n, 1, 1, 1), cropped.flip(3), cropped)


def _crop(padded: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, h: int, w: int) -> torch.Tensor:
    n, c = padded.shape[:2]
    device = padded.device
    rows = (dy.view(n, 1) + torch.arange(h, device=device)).view(n, 1, h, 1).expand(n, c, h, padded.shape[3])
    picked_rows = padded.gather(2, rows)
    cols = (dx.view(n, 1) + torch.arange(w, device=device)).view(n, 1, 1, w).expand(n, c, h, w)
    return picked_rows.gather(3, cols)


def _read_split(root: str, train: bool):
    """torchvision's CIFAR10 reader without its md5 check (prepare() checks the files are there).

    The md5 check re-hashes 170 MB on every start and rejects the small stand-in sets tests use.
    """
    from torchvision.datasets import CIFAR10 as TorchvisionCIFAR10

    class Reader(TorchvisionCIFAR10):
        def _check_integrity(self) -> bool:
            return all((Path(self.root) / BATCH_DIR / name).is_file() for name in FILES)

        def _load_meta(self) -> None:
            import pickle

            with open(Path(self.root) / BATCH_DIR / "batches.meta", "rb") as f:
                self.classes = pickle.load(f, encoding="latin1")["label_names"]
            self.class_to_idx = {name: i for i, name in enumerate(self.classes)}

    return Reader(root, train=train, download=False)


def _to_tensor(data, device: torch.device) -> torch.Tensor:
    """N x 32 x 32 x 3 uint8 (numpy) -> N x 3 x 32 x 32 uint8 tensor; kept uint8 (4x less memory)."""
    return torch.as_tensor(data).permute(0, 3, 1, 2).contiguous().to(device)
