"""This process's compute: its device, its collective backend and its CPU threads.

The choices (:data:`DEVICE_CHOICES`, :data:`BACKEND_CHOICES`) are importable without torch, so
command-line parsers can list them; the functions import torch when called.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from shoal.env.host import threads_per_process
from shoal.errors import ShoalError, check_choice

NO_CUDA = (
    "--device cuda was asked for but CUDA is not available on this machine",
    "use --device cpu (or auto), or install a CUDA build of torch on a machine with a GPU",
)
"""The error (message, hint) of ``--device cuda`` where no GPU can be used."""

if TYPE_CHECKING:
    import torch

DEVICE_CHOICES = ("auto", "cpu", "cuda")
BACKEND_CHOICES = ("auto", "gloo", "nccl")


def choose_device(requested: str, local_rank: int, local_world_size: int) -> "torch.device":
    """The device this process computes on.

    ``auto`` gives ``cuda:<local_rank>`` when CUDA is available with at least ``local_world_size``
    GPUs on this node, otherwise the CPU. ``cuda`` without enough GPUs is an error, not a fallback.
    """
    import torch

    check_choice("device", requested, DEVICE_CHOICES)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested == "cpu":
        return torch.device("cpu")
    if requested == "cuda":
        if gpus == 0:
            raise ShoalError(*NO_CUDA)
        if gpus < local_world_size:
            raise ShoalError(
                f"{local_world_size} processes on this node but only {gpus} GPU(s) visible",
                f"start at most {gpus} processes per node (--nproc {gpus}), or check CUDA_VISIBLE_DEVICES",
            )
        return torch.device("cuda", local_rank)
    if gpus >= local_world_size and gpus > 0:
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def workers_device(requested: str, nproc: int, *, spawned: bool) -> "torch.device":
    """:func:`choose_device` for the workers a launcher is about to start, decided in the launcher
    without initialising CUDA there when the workers will be forked (the CUDA driver does not survive
    a fork): with ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` torch counts the GPUs through NVML and leaves
    the driver alone. Spawned workers start clean, so nothing is needed for them."""
    if spawned:
        return choose_device(requested, 0, nproc)
    with _counted_by_nvml():
        return choose_device(requested, 0, nproc)


def visible_gpus() -> list[str]:
    """This node's GPUs as a child process's ``CUDA_VISIBLE_DEVICES`` would name them: this
    process's own list when it has one, else ``0`` .. ``N-1``; counted without initialising CUDA
    here (NVML), so that processes forked from this one can still use it. Empty without CUDA."""
    import torch

    with _counted_by_nvml():
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [name.strip() for name in given.split(",") if name.strip()] if given is not None else None
    return (names if names is not None else [str(index) for index in range(count)])[:count]


@contextlib.contextmanager
def _counted_by_nvml() -> Iterator[None]:
    name = "PYTORCH_NVML_BASED_CUDA_CHECK"
    if name in os.environ:
        yield
        return
    os.environ[name] = "1"
    try:
        yield
    finally:
        os.environ.pop(name, None)


def choose_backend(requested: str, device: "torch.device") -> str:
    """``nccl`` for CUDA devices and ``gloo`` for the CPU unless one is asked for explicitly."""
    check_choice("backend", requested, BACKEND_CHOICES)
    if requested == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if requested == "nccl" and device.type != "cuda":
        raise ShoalError(
            "the nccl backend needs CUDA devices, but this process runs on the CPU",
            "use --backend gloo (or auto) on CPU",
        )
    return requested


def configure_threads(threads: int | None, local_world_size: int) -> int:
    """Set torch's intra-op threads: explicit value, else OMP_NUM_THREADS, else cores / local procs."""
    import torch

    if threads is None:
        env = os.environ.get("OMP_NUM_THREADS", "")
        # Applied explicitly: torch reads OMP_NUM_THREADS only when it starts, and a worker forked
        # from a process that imported torch earlier inherits that process's thread count.
        threads = int(env) if env.isdigit() and int(env) > 0 else threads_per_process(local_world_size)
    if threads < 1:
        raise ShoalError(f"threads must be at least 1, got {threads}", "pass threads=1 or more")
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads
