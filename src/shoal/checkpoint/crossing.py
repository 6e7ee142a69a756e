"""Crossing between a ``.pt`` checkpoint (full tensors, written by DDP or one process) and an
FSDP-sharded model: finding the sharded model among the objects, refusing to save one as a ``.pt``
file, and an index-keyed optimizer state re-keyed by parameter name and split over the ranks."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from shoal.distributed.fsdp import is_fsdp
from shoal.distributed.wrap import unwrap_model
from shoal.errors import ShoalError


def fsdp_model(objects: Mapping[str, Any]) -> nn.Module | None:
    """The FSDP-sharded model among ``objects``, if any (the optimizers then belong to it)."""
    for obj in objects.values():
        if isinstance(obj, nn.Module) and is_fsdp(unwrap_model(obj)):
            return unwrap_model(obj)
    return None


def refuse_fsdp(objects: Mapping[str, Any]) -> None:
    if fsdp_model(objects) is not None:
        raise ShoalError(
            "an FSDP-sharded model is saved as a sharded checkpoint, not a .pt file",
            "create the checkpoint manager with sharded=True (every rank then writes its own shards)",
        )


def load_optimizer_into_fsdp(model: nn.Module, opt: torch.optim.Optimizer, state: Any, name: str, path: Path) -> None:
    """A ``.pt`` checkpoint's optimizer state (written by DDP or one process: keyed by parameter
    index, full tensors) into the optimizer of an FSDP model. Index i is the i-th parameter of the
    optimizer's param groups, in order: as the optimizer was built, the same way in both jobs, from
    the same model's parameters, that is the i-th of ``model.named_parameters()`` (or of the
    groups the caller made). Re-keyed by those names, it is loaded as a full optimizer state dict:
    each rank keeps its slice of every moment. Collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = {id(p): n for n, p in model.named_parameters()}
    order = [names.get(id(p)) for group in opt.param_groups for p in group["params"]]
    groups = state.get("param_groups", []) if isinstance(state, Mapping) else []
    saved = [i for group in groups for i in group.get("params", [])]
    if None in order or len(groups) != len(opt.param_groups) or sorted(saved) != list(range(len(order))):
        raise ShoalError(
            f"checkpoint {path} does not fit {name}: {len(saved)} parameter(s) in {len(groups)} group(s) saved, "
            f"{len(order)} in {len(opt.param_groups)} here",
            "resume with the same model and optimizer that wrote it, or start a new --out",
        )
    if not state.get("state"):
        opt.load_state_dict(state)  # never stepped: hyperparameters only, no tensor to split
        return
    by_name = {
        "state": {order[int(i)]: value for i, value in state["state"].items()},
        "param_groups": [{**group, "params": [order[i] for i in group["params"]]} for group in groups],
    }
    try:
        set_optimizer_state_dict(model, opt, by_name, options=StateDictOptions(full_state_dict=True))
    except (RuntimeError, ValueError, KeyError) as err:
        raise ShoalError(
            f"checkpoint {path} does not fit {name}: {str(err).splitlines()[0]}",
            "resume with the same model and optimizer that wrote it, or start a new --out",
        ) from None
