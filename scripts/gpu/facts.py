"""The GPU machine's facts as one JSON object on stdout: device, driver, CUDA, torch, NCCL, cuDNN.

Run in its own process by scripts/gpu/check.py, so the checker itself never holds a CUDA context
(it would take GPU memory from the benchmarks it runs). Without CUDA: ``"cuda": false`` and why.
"""

from __future__ import annotations

import json
import platform
import subprocess


def facts() -> dict:
    import torch

    out: dict = {"python": platform.python_version(), "torch": torch.__version__, "cuda_build": torch.version.cuda}
    out["cuda"] = bool(torch.cuda.is_available())
    if not out["cuda"]:
        out["why"] = "torch is a CPU-only build" if torch.version.cuda is None else "no CUDA device visible"
        return out
    count = torch.cuda.device_count()
    props = torch.cuda.get_device_properties(0)
    out.update(
        gpus=count,
        device=torch.cuda.get_device_name(0),
        memory_gib=round(props.total_memory / 2**30, 1),
        capability=f"{props.major}.{props.minor}",
        bf16=torch.cuda.is_bf16_supported(),
        nccl=_nccl(),
        cudnn=torch.backends.cudnn.version(),
        driver=_driver(),
    )
    return out


def _nccl() -> str | None:
    """The NCCL version torch was built with (a tuple in current torch, an int in old ones)."""
    try:
        import torch.cuda.nccl

        version = torch.cuda.nccl.version()
    except (ImportError, AttributeError, RuntimeError):
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _driver() -> str | None:
    """The NVIDIA driver's version, from nvidia-smi (torch does not expose it)."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.split()
    return lines[0] if done.returncode == 0 and lines else None


if __name__ == "__main__":
    print(json.dumps(facts()))
