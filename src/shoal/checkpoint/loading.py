"""A loaded checkpoint (:class:`Checkpoint`) and its state put back into the job's objects
(:func:`restore`): a ``.pt`` file's full state into a plain, DDP or FSDP model, or a ``.dcp``
directory's through :func:`~shoal.checkpoint.sharded.load_sharded`; per-rank state and RNGs on an
unchanged world size."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from shoal.checkpoint.crossing import fsdp_model, load_optimizer_into_fsdp
from shoal.checkpoint.rng import restore_rng
from shoal.checkpoint.sharded import load_sharded
from shoal.distributed import collectives
from shoal.distributed.fsdp import is_fsdp, load_full_state_dict
from shoal.distributed.wrap import unwrap_model
from shoal.errors import ShoalError


@dataclass
class Checkpoint:
    """A loaded checkpoint: where it came from and what it holds."""

    path: Path
    payload: dict[str, Any]

    @property
    def epoch(self) -> int:
        return int(self.payload["epoch"])

    @property
    def step(self) -> int:
        return int(self.payload["step"])

    @property
    def world_size(self) -> int:
        return int(self.payload["world_size"])

    @property
    def extra(self) -> dict[str, Any]:
        return self.payload.get("extra") or {}

    @property
    def sharded(self) -> bool:
        """A ``.dcp`` directory: its payload holds epoch, step, world size and extra only; the state
        is read by :func:`restore` (every rank its own slice)."""
        return bool(self.payload.get("sharded"))


def restore(checkpoint: Checkpoint, objects: Mapping[str, Any], *, per_rank: Mapping[str, Any] | None = None) -> None:
    """Load ``checkpoint``'s state into ``objects``, and this rank's own state into ``per_rank``
    objects and its RNGs.

    Per-rank state comes back when the world size is unchanged; with another world size the ranks
    keep the state they were seeded with (their data order is restored either way). A model whose
    keys differ from the checkpoint's is a :class:`ShoalError` naming the keys.

    Collective for a ``.dcp`` checkpoint (DCP reads each rank's slice, for this job's world size
    and wrapping) and for a ``.pt`` one restored into an FSDP model (its full tensors are split
    over the ranks; the optimizer's index-keyed state is re-keyed by parameter name first).
    """
    if checkpoint.sharded:
        found = load_sharded(checkpoint.path, objects, per_rank=per_rank)
        checkpoint.payload["extra"] = found.extra
        return
    saved = checkpoint.payload["state"]
    missing = [name for name in objects if name not in saved]
    if missing:
        raise ShoalError(
            f"checkpoint {checkpoint.path} has no state for {', '.join(missing)}",
            "resume with the same kind of run that wrote it, or start a new --out",
        )
    sharded_model = fsdp_model(objects)
    for name, obj in objects.items():
        if sharded_model is not None and isinstance(obj, torch.optim.Optimizer):
            load_optimizer_into_fsdp(sharded_model, obj, saved[name], name, checkpoint.path)
        else:
            _load_into(obj, saved[name], name, checkpoint.path)
    ranks = checkpoint.payload.get("ranks") or []
    rank = collectives.rank()
    if checkpoint.world_size == collectives.world_size() and rank < len(ranks):
        mine = ranks[rank]
        for name, obj in (per_rank or {}).items():
            if name in mine["objects"]:
                obj.load_state_dict(mine["objects"][name])
        restore_rng(mine["rng"])


def _load_into(obj: Any, state: Any, name: str, path: Path) -> None:
    if isinstance(obj, nn.Module):
        target = unwrap_model(obj)
        problems = []
        if is_fsdp(target):
            # A full state dict into shards: every rank has the whole file and keeps its slice.
            expected = set(target.state_dict())
            if missing := sorted(expected - set(state)):
                problems.append(f"missing {_few(missing)}")
            if unexpected := sorted(set(state) - expected):
                problems.append(f"unexpected {_few(unexpected)}")
            if not problems:
                load_full_state_dict(target, state)
        else:
            result = target.load_state_dict(state, strict=False)
            if result.missing_keys:
                problems.append(f"missing {_few(result.missing_keys)}")
            if result.unexpected_keys:
                problems.append(f"unexpected {_few(result.unexpected_keys)}")
        if problems:
            raise ShoalError(
                f"checkpoint {path} does not fit the model ({name}): {'; '.join(problems)}",
                "resume with the model that wrote it, or start a new --out",
            )
        return
    try:
        obj.load_state_dict(state)
    except (RuntimeError, ValueError, KeyError) as err:
        raise ShoalError(
            f"checkpoint {path} does not fit {name}: {str(err).splitlines()[0]}",
            "resume with the same configuration that wrote it, or start a new --out",
        ) from None


def _few(keys: list[str], limit: int = 5) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")
