"""Software checks: Python, torch, CUDA, NCCL and shoal, and the versions every node must share."""

from __future__ import annotations

import glob
import os
import platform
import sys

from shoal.doctor.model import Check, fail, ok

MIN_PYTHON = (3, 10)
NONE = "none"


def versions() -> dict[str, str]:
    """What must be the same on every node of a job: a mismatch breaks pickled objects, collectives
    (NCCL's wire protocol) or checkpoints. ``none`` where not present."""
    import torch

    import shoal

    return {
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "cuda": str(torch.version.cuda or NONE),
        "nccl": nccl_version() or NONE,
        "shoal": shoal.__version__,
    }


def nccl_version() -> str | None:
    """The NCCL version torch was built with (None for a build without it)."""
    try:
        import torch

        version = torch.cuda.nccl.version()
    except Exception:  # a CPU build has no NCCL binding (AttributeError, RuntimeError)
        return None
    return ".".join(str(part) for part in version) if isinstance(version, tuple) else str(version)


def gpu_hardware() -> list[str]:
    """NVIDIA device nodes of this machine (present even where CUDA cannot use them)."""
    return sorted(glob.glob("/dev/nvidia[0-9]*"))


def software_checks() -> list[Check]:
    """Python, torch, CUDA, NCCL and shoal: versions, and whether CUDA works where GPUs exist."""
    import torch

    import shoal

    found = versions()
    checks = []
    here = f"{found['python']} ({sys.executable})"
    if sys.version_info[:2] < MIN_PYTHON:
        need = ".".join(map(str, MIN_PYTHON))
        checks.append(fail("python", f"Python {here}: shoal needs {need} or newer", f"use Python {need}+"))
    else:
        checks.append(ok("python", f"Python {here}", version=found["python"], executable=sys.executable))
    build = f"CUDA {found['cuda']} build" if found["cuda"] != NONE else "CPU-only build"
    checks.append(ok("torch", f"torch {found['torch']} ({build})", version=found["torch"], cuda_build=found["cuda"]))
    checks.append(_cuda_check(torch, found["cuda"]))
    nccl = found["nccl"]
    if nccl == NONE:
        checks.append(ok("nccl", "no NCCL in this torch build: gloo only (CPU)", version=NONE))
    elif torch.cuda.is_available():
        checks.append(ok("nccl", f"NCCL {nccl} (torch's own)", version=nccl))
    else:
        checks.append(ok("nccl", f"NCCL {nccl} (torch's own; unused without a GPU)", version=nccl))
    location = os.path.dirname(os.path.dirname(os.path.abspath(shoal.__file__)))
    checks.append(ok("shoal", f"shoal {found['shoal']} (from {location})", version=found["shoal"], path=location))
    return checks


def _cuda_check(torch, cuda_build: str) -> Check:
    devices = gpu_hardware()
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        names = sorted({torch.cuda.get_device_name(i) for i in range(count)})
        return ok(
            "cuda",
            f"CUDA {cuda_build}: {count} GPU(s) usable ({', '.join(names)})",
            version=cuda_build,
            gpus=count,
            names=names,
        )
    if devices and cuda_build != NONE:
        return fail(
            "cuda",
            f"this machine has NVIDIA GPUs ({', '.join(devices[:4])}) but torch's CUDA {cuda_build} cannot use them",
            "check `nvidia-smi`: the driver must support CUDA "
            f"{cuda_build} (else install a torch built for an older CUDA), and the GPUs must be visible here",
            version=cuda_build,
            devices=devices,
        )
    if devices:
        return fail(
            "cuda",
            f"this machine has NVIDIA GPUs ({', '.join(devices[:4])}) but torch is a CPU-only build",
            "install a CUDA build of torch (https://pytorch.org/get-started/locally/)",
            version=NONE,
            devices=devices,
        )
    return ok("cuda", "no GPU on this machine: the job runs on the CPU (gloo)", version=cuda_build, gpus=0)
