"""Wrapping a model for the job, and unwrapping it again for saving.

``apply_ddp`` is a pure function of the model and the context: it never touches the training loop.
Saved state dicts never carry the ``module.`` (DDP) or ``_orig_mod.`` (torch.compile) prefixes, so a
model saved from 8 processes loads into the plain model on a laptop. An FSDP2-sharded model
(:func:`shoal.distributed.fsdp.apply_fsdp`) is its own module (FSDP2 shards in place), and its state
dict is gathered into plain full tensors by :func:`model_state_dict`, collectively.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from shoal.errors import ShoalError

_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def apply_ddp(model: nn.Module, device: torch.device, world_size: int, **ddp_kwargs: Any) -> nn.Module:
    """Move ``model`` to ``device`` and wrap it in DDP when there is more than one process.

    With one process, or without trainable parameters, the model is returned as is (no wrapper,
    no overhead). ``ddp_kwargs`` go to
    :class:`~torch.nn.parallel.DistributedDataParallel`; shoal's defaults are listed in the code.
    """
    model = model.to(device)
    if world_size <= 1 or not any(p.requires_grad for p in model.parameters()):
        # One process, or nothing to train (a frozen model used for inference): DDP would only
        # add cost, and refuses models without trainable parameters anyway.
        return model
    # gradient_as_bucket_view: gradients live in the all-reduce buckets, saving one copy per step
    # and the memory of a second set of gradients (torch docs, DDP "gradient_as_bucket_view").
    options: dict[str, Any] = {"gradient_as_bucket_view": True}
    options.update(ddp_kwargs)
    if device.type == "cuda":
        options.setdefault("device_ids", [device.index])
        options.setdefault("output_device", device.index)
    return DistributedDataParallel(model, **options)


def wrap_model(
    model: nn.Module,
    *,
    strategy: str = "ddp",
    device: torch.device,
    world_size: int,
    mixed_precision: str = "off",
    cpu_offload: bool = False,
    comm_hook: str | None = None,
    **ddp_kwargs: Any,
) -> nn.Module:
    """The model wrapped for ``strategy``: :func:`apply_ddp` (the default) or
    :func:`~shoal.distributed.fsdp.apply_fsdp`; what ``ctx.wrap(model, strategy=...)`` and the
    trainer's ``--strategy`` call. Unknown strategies, DDP options or a comm hook with FSDP, and
    FSDP options with DDP are refused with one line and a HINT."""
    from shoal.distributed.fsdp import apply_fsdp
    from shoal.distributed.strategy import check_strategy, refuse_comm_hook_with_fsdp

    check_strategy(strategy)
    refuse_comm_hook_with_fsdp(comm_hook, strategy)
    if strategy == "fsdp":
        if ddp_kwargs:
            raise ShoalError(
                f"DDP options ({', '.join(sorted(ddp_kwargs))}) do not apply to strategy fsdp",
                "drop them, or use strategy ddp",
            )
        return apply_fsdp(model, device=device, mixed_precision=mixed_precision, cpu_offload=cpu_offload)
    if mixed_precision != "off" or cpu_offload:
        raise ShoalError(
            "mixed_precision and cpu_offload are FSDP options",
            "use strategy fsdp, or autocast (--amp) with ddp",
        )
    return apply_ddp(model, device, world_size, **ddp_kwargs)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's own module inside any DDP / FSDP-style ``.module`` or torch.compile wrapper.

    An FSDP2 model comes back as it is: it is the user's module (its class swapped in place for an
    ``FSDP<Name>`` subclass), its parameters DTensor shards."""
    while True:
        if isinstance(model, DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        else:
            return model


def clean_state_dict(state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` with every leading ``module.`` / ``_orig_mod.`` removed from its keys."""
    cleaned = {}
    for key, value in state.items():
        stripped = True
        while stripped:
            stripped = False
            for prefix in _WRAPPER_PREFIXES:
                if key.startswith(prefix):
                    key = key[len(prefix) :]
                    stripped = True
        cleaned[key] = value
    return cleaned


def model_state_dict(model: nn.Module) -> dict[str, Any]:
    """The plain state dict of the unwrapped model, ready for ``torch.save``.

    For a model sharded by FSDP2 the shards are gathered into full CPU tensors on rank 0 (the other
    ranks get ``{}``): then it is collective, and every rank must call it at the same point.
    """
    from shoal.distributed.fsdp import full_model_state_dict, is_fsdp

    inner = unwrap_model(model)
    if is_fsdp(inner):
        return clean_state_dict(full_model_state_dict(inner))
    return clean_state_dict(inner.state_dict())
