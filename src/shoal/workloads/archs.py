"""The ``--arch`` choices of the bundled workloads, without torch: a wrong name fails before torch loads.

``synthetic`` takes a torchvision ResNet or ``mlp``; ``cifar10`` a ResNet; ``language`` a model preset
(:data:`shoal.workloads.language_model.PRESETS`), where the trainer's default ``resnet18`` reads as
``tiny``. ``digits`` and ``mnist`` have one model each and ignore ``--arch``.
"""

from __future__ import annotations

from shoal.errors import ShoalError

RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")
SYNTHETIC = (*RESNETS, "mlp")
LANGUAGE_PRESETS = ("tiny", "small", "large")
TRAINER_DEFAULT_ARCH = "resnet18"
"""``TrainConfig.arch``'s default (the flag is shared by synthetic, cifar10 and language)."""


def check_arch(workload: str, arch: str) -> None:
    """A ShoalError naming the choices if bundled ``workload`` has no model ``arch`` (others: nothing)."""
    if workload == "synthetic" and arch not in SYNTHETIC:
        raise ShoalError(f"unknown architecture {arch!r}", f"choose --arch from: {', '.join(SYNTHETIC)}")
    if workload == "cifar10" and arch not in RESNETS:
        raise ShoalError(
            f"cifar10 trains a ResNet; --arch {arch!r} is not one", f"choose --arch from: {', '.join(RESNETS)}"
        )
    if workload == "language" and arch not in (*LANGUAGE_PRESETS, TRAINER_DEFAULT_ARCH):
        raise ShoalError(
            f"the language workload has no model preset {arch!r}",
            f"choose --arch from: {', '.join(LANGUAGE_PRESETS)} (tiny for tests, large exceeds a 1 GiB budget "
            "per worker)",
        )
