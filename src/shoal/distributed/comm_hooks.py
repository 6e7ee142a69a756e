"""Gradient compression for DDP: torch's built-in communication hooks, chosen by name.

``register_comm_hook(model, "bf16")`` makes DDP cast each gradient bucket to bfloat16 before the
all-reduce and back to float32 after it: half the bytes on the wire, at the cost of rounding the
*averaged* gradient to 8 mantissa bits (the parameters and the optimizer stay in float32). The
hooks are torch's own (``torch.distributed.algorithms.ddp_comm_hooks.default_hooks``), nothing is
re-implemented here.

Checked with torch 2.14.1 on CPU: both ``bf16_compress_hook`` and ``fp16_compress_hook`` work with
gloo (gloo sums bfloat16 and float16 tensors), so no fallback is needed. Whether compression pays
off depends on the job: it helps when the all-reduce is the bottleneck (a slow network between
nodes) and costs two casts per bucket otherwise; ``shoal bench scaling --comm-hook bf16`` measures it
(docs/BENCHMARKS.md has the numbers for 2 CPU processes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shoal.errors import ShoalError

if TYPE_CHECKING:
    from torch import nn

COMM_HOOKS = ("none", "bf16", "fp16")
"""The names :func:`register_comm_hook` accepts."""

_TORCH_HOOKS = {"bf16": "bf16_compress_hook", "fp16": "fp16_compress_hook"}


def check_comm_hook(name: str) -> str:
    """``name`` if it is a known hook name, else a :class:`ShoalError` listing the choices."""
    if name not in COMM_HOOKS:
        raise ShoalError(
            f"unknown communication hook {name!r}",
            f"use one of: {', '.join(COMM_HOOKS)} (none: plain float32 all-reduce)",
        )
    return name


def register_comm_hook(model: "nn.Module", name: str, *, process_group: Any = None) -> "nn.Module":
    """Register torch's ``name`` gradient-compression hook on a DDP ``model``; return the model.

    Args:
        model: what :func:`shoal.apply_ddp` / ``ctx.wrap`` returned. A model that is not wrapped in
            DDP (one process: there is no gradient all-reduce to compress) is returned unchanged.
        name: ``none`` (leave DDP's float32 all-reduce alone), ``bf16`` or ``fp16``.
        process_group: the group DDP reduces over; default: the whole job.

    Raises:
        ShoalError: for an unknown ``name``.

    DDP accepts one hook per model: registering a second one raises torch's RuntimeError.
    """
    check_comm_hook(name)
    if name == "none":
        return model
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        return model
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    hook = getattr(default_hooks, _TORCH_HOOKS[name])
    # The hook's state is the process group (None: the default group, as torch's hooks expect).
    model.register_comm_hook(process_group, hook)
    return model
