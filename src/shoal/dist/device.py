"""Choosing the device and the collective backend for one process."""

from __future__ import annotations

import torch

from shoal.errors import ShoalError

DEVICE_CHOICES = ("auto", "cpu", "cuda")
BACKEND_CHOICES = ("auto", "gloo", "nccl")


def choose_device(requested: str, local_rank: int, local_world_size: int) -> torch.device:
    """The device this process computes on.

    ``auto`` gives ``cuda:<local_rank>`` when CUDA is available with at least ``local_world_size``
    GPUs on this node, otherwise the CPU. ``cuda`` without enough GPUs is an error, not a fallback.
    """
    if requested not in DEVICE_CHOICES:
        raise ShoalError(
            f"unknown device {requested!r}", f"use one of: {', '.join(DEVICE_CHOICES)}"
        )
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested == "cpu":
        return torch.device("cpu")
    if requested == "cuda":
        if gpus == 0:
            raise ShoalError(
                "--device cuda was asked for but CUDA is not available on this machine",
                "use --device cpu (or auto), or install a CUDA build of torch on a machine with a GPU",
            )
        if gpus < local_world_size:
            raise ShoalError(
                f"{local_world_size} processes on this node but only {gpus} GPU(s) visible",
                f"start at most {gpus} processes per node (--nproc {gpus}), or check CUDA_VISIBLE_DEVICES",
            )
        return torch.device("cuda", local_rank)
    if gpus >= local_world_size and gpus > 0:
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def choose_backend(requested: str, device: torch.device) -> str:
    """``nccl`` for CUDA devices and ``gloo`` for the CPU unless one is asked for explicitly."""
    if requested not in BACKEND_CHOICES:
        raise ShoalError(
            f"unknown backend {requested!r}", f"use one of: {', '.join(BACKEND_CHOICES)}"
        )
    if requested == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if requested == "nccl" and device.type != "cuda":
        raise ShoalError(
            "the nccl backend needs CUDA devices, but this process runs on the CPU",
            "use --backend gloo (or auto) on CPU",
        )
    return requested
