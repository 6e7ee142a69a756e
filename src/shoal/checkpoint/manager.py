"""Saving training state on a cadence, keeping the newest K, and loading the newest valid one.

A checkpoint is one file, ``ckpt-e<epoch>-s<step>.pt``, written by rank 0 with
:func:`~shoal.checkpoint.storage.atomic_torch_save`; the ``latest`` pointer moves only after the
file is durable, and retention runs only after that, so at every instant the directory holds the
previous good checkpoint or the new one. Loading uses ``weights_only=True`` (a checkpoint cannot run
code), skips a truncated or corrupt file with a warning naming it, and falls back to the one before.

With ``sharded=True`` (what an FSDP job needs) a checkpoint is a directory,
``ckpt-e<epoch>-s<step>.dcp``, that every rank writes its shards into
(:mod:`shoal.checkpoint.sharded`, torch.distributed.checkpoint), committed by one atomic rename;
``async_save=True`` returns once the state is copied to host memory and writes in the background.
Both kinds live in one directory, in one (epoch, step) order: whichever is newest and valid is
resumed, by a DDP or an FSDP job, on any world size.

Everything that must survive is passed as ``objects``: anything with ``state_dict()`` /
``load_state_dict()`` (models are saved unwrapped, without ``module.`` prefixes). The RNG states of
every rank are saved too. The payload is a plain dict of tensors and Python values, so it stays
open to ``torch.distributed.checkpoint`` for sharded state later.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from shoal.checkpoint.cadence import Cadence
from shoal.checkpoint.rng import capture_rng, restore_rng
from shoal.checkpoint.sharded import (
    checkpoint_name,
    inspect_sharded,
    is_sharded,
    load_sharded,
    remove_stale,
    save_sharded,
    wait_pending,
)
from shoal.checkpoint.storage import (
    TMP_PREFIX,
    atomic_torch_save,
    atomic_write_text,
    remove_temporaries,
    torch_load,
)
from shoal.distributed import collectives
from shoal.distributed.fsdp import is_fsdp, load_full_state_dict
from shoal.distributed.wrap import model_state_dict, unwrap_model
from shoal.errors import ShoalError

FORMAT_VERSION = 1
POINTER = "latest"
_NAME = re.compile(r"^ckpt-e(\d+)-s(\d+)\.(pt|dcp)$")
_REQUIRED = ("format_version", "epoch", "step", "state", "world_size")


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


@dataclass
class CheckpointManager:
    """Save every ``every`` (a :class:`Cadence` or its text), keep the newest ``keep`` files.

    ``save`` and ``load_latest`` are collective: call them on every rank at the same point.

    Epochs are numbered as the caller's loop numbers them, from ``first_epoch``: 0 for
    ``for epoch in range(epochs)`` (what :meth:`shoal.Context.checkpointer` gives), 1 for a loop
    that counts from 1 (``shoal train``'s). Either way ``every="2epochs"`` saves after the 2nd, 4th,
    6th... completed epoch, and ``final=True`` at the last epoch's end saves it whatever the cadence.
    """

    directory: Path
    every: Cadence | str | int | None = None
    keep: int = 3
    warnings: list[str] = field(default_factory=list)
    first_epoch: int = 1
    """The number the caller's loop gives its first epoch (0 or 1)."""
    sharded: bool = False
    """Save ``.dcp`` directories (every rank writes its shards) instead of rank 0's ``.pt`` file.
    Needed for an FSDP model; a DDP job may use it too. Loading reads both kinds either way."""
    async_save: bool = False
    """Return from :meth:`save` once the state is copied to host memory; the write and the commit
    (pointer, retention) finish in the background. Implies ``sharded`` (only DCP saves can be
    asynchronous). Call :meth:`wait` on every rank before exiting."""

    def __post_init__(self) -> None:
        self.directory = Path(self.directory)
        if not isinstance(self.every, Cadence):
            self.every = Cadence.parse(self.every)
        if self.keep < 1:
            raise ShoalError(f"--keep must be at least 1, got {self.keep}", "pass --keep 1 or more")
        if self.first_epoch not in (0, 1):
            raise ShoalError(
                f"first_epoch must be 0 or 1, got {self.first_epoch}",
                "pass 0 for `for epoch in range(epochs)`, 1 for a loop counting from 1",
            )
        if self.async_save:
            self.sharded = True

    # -- saving ---------------------------------------------------------------------------------

    def due(self, *, epoch: int, step: int, epoch_end: bool, final: bool = False, force: bool = False) -> bool:
        """Whether to save now: the cadence says so, or it is the run's last epoch end (``final``,
        unless checkpoints are off), or ``force`` (a preemption). The one place that decides.

        ``epoch``: the epoch in progress (or just ended, with ``epoch_end``), numbered from
        :attr:`first_epoch`; ``step``: optimizer steps done so far in the whole run.
        """
        if force:
            return True
        if final and epoch_end:
            return self.every.every > 0
        epochs_done = epoch - self.first_epoch + 1
        return self.every.due(step=step, epochs_done=epochs_done, epoch_end=epoch_end)

    def maybe_save(
        self,
        *,
        epoch: int,
        step: int,
        epoch_end: bool,
        objects: Mapping[str, Any],
        final: bool = False,
        force: bool = False,
        **kwargs: Any,
    ) -> Path | None:
        """Save if :meth:`due` says so (see :meth:`save` for the rest). Call it after every
        optimizer step with ``epoch_end=False`` for a step cadence, and after every epoch with
        ``epoch_end=True`` and ``final=`` whether that epoch was the run's last (which is saved
        whatever the cadence, so a finished run always ends on a checkpoint)."""
        if self.due(epoch=epoch, step=step, epoch_end=epoch_end, final=final, force=force):
            return self.save(epoch=epoch, step=step, objects=objects, **kwargs)
        return None

    def save(
        self,
        *,
        epoch: int,
        step: int,
        objects: Mapping[str, Any],
        extra: Mapping[str, Any] | None = None,
        per_rank: Mapping[str, Any] | None = None,
    ) -> Path | None:
        """Write a checkpoint (rank 0 writes; every rank contributes its RNG state).

        ``objects`` are the same on every rank (replicated model, optimizer, data position): rank
        0's are saved. ``per_rank`` objects differ between ranks (an augmentation RNG): every
        rank's are saved. Returns the path on rank 0, None elsewhere, once the file is durable and
        every rank has got there, so a process may exit right after it.

        With :attr:`sharded`, every rank writes its own shards of the model and optimizer (an FSDP
        model's are never gathered); with :attr:`async_save` it returns once the state is copied to
        host memory, and the checkpoint is committed (``latest`` pointer, retention) in the
        background: the next save, a load or :meth:`wait` waits for it.
        """
        if self.sharded:
            return self._save_sharded(epoch=epoch, step=step, objects=objects, extra=extra, per_rank=per_rank)
        _refuse_fsdp(objects)
        wait_pending()  # an async sharded save in flight commits (pointer, retention) first
        mine = {"rng": capture_rng(), "objects": {name: obj.state_dict() for name, obj in (per_rank or {}).items()}}
        ranks = _gather(mine)
        path = None
        if collectives.rank() == 0:
            payload = {
                "format_version": FORMAT_VERSION,
                "shoal_version": _shoal_version(),
                "torch_version": str(torch.__version__),  # TorchVersion is not a weights_only type
                "world_size": collectives.world_size(),
                "epoch": int(epoch),
                "step": int(step),
                "state": {name: _state_of(obj) for name, obj in objects.items()},
                "ranks": ranks,
                "extra": dict(extra or {}),
            }
            self.directory.mkdir(parents=True, exist_ok=True)
            path = atomic_torch_save(payload, self.directory / f"ckpt-e{epoch:05d}-s{step:09d}.pt")
            atomic_write_text(self.directory / POINTER, path.name + "\n")
            self._retain(newest=path)
        collectives.barrier()
        return path

    def _save_sharded(
        self,
        *,
        epoch: int,
        step: int,
        objects: Mapping[str, Any],
        extra: Mapping[str, Any] | None,
        per_rank: Mapping[str, Any] | None,
    ) -> Path | None:
        path = self.directory / checkpoint_name(epoch, step)
        save_sharded(
            path,
            objects,
            per_rank=per_rank,
            extra={"epoch": int(epoch), "step": int(step), **dict(extra or {})},
            async_=self.async_save,
            on_commit=self._committed,
        )
        return path if collectives.rank() == 0 else None

    def _committed(self, path: Path) -> None:
        """Rank 0, once a sharded checkpoint is in place (for an async save: in the writer thread)."""
        atomic_write_text(self.directory / POINTER, path.name + "\n")
        self._retain(newest=path)

    def wait(self) -> None:
        """Wait until the async save in flight (if any) is committed; raise a :class:`ShoalError` if
        it failed. Call it on every rank before the process exits (end of training, preemption)."""
        wait_pending()

    def _retain(self, newest: Path) -> None:
        for old in self.checkpoints()[: -self.keep]:
            if old == newest:
                continue
            if old.is_dir():
                # Out of sight in one rename, then deleted: a kill during the deletion leaves a
                # .tmp- directory (removed by the next save), never a half-deleted checkpoint.
                doomed = old.with_name(f"{TMP_PREFIX}{old.name}.old")
                shutil.rmtree(doomed, ignore_errors=True)
                os.replace(old, doomed)
                shutil.rmtree(doomed, ignore_errors=True)
            else:
                old.unlink(missing_ok=True)
        # Saves killed half-way (checkpoint or pointer) leave temporaries; they go once a good
        # save exists. Only rank 0 writes here, and no other save is in flight (one at a time).
        for target in ("ckpt-*", POINTER):
            remove_temporaries(self.directory, target)
        remove_stale(self.directory)

    # -- loading --------------------------------------------------------------------------------

    def checkpoints(self) -> list[Path]:
        """Checkpoints, oldest first (by epoch, then step): ``.pt`` files and committed ``.dcp``
        directories together (of the same epoch and step, the ``.pt`` counts as the newer)."""
        if not self.directory.is_dir():
            return []
        found = []
        for path in self.directory.iterdir():
            match = _NAME.match(path.name)
            if match and (match.group(3) == "pt" or is_sharded(path)):
                found.append(((int(match.group(1)), int(match.group(2)), match.group(3)), path))
        return [path for _, path in sorted(found)]

    def load_latest(self, map_location: Any = "cpu") -> Checkpoint | None:
        """The newest checkpoint that loads and is complete, or None when there is none at all.

        Rank 0 picks the file (skipping corrupt ones with a warning); every rank then loads that
        same file. Raises :class:`ShoalError` when files exist but none is valid.

        A ``.dcp`` checkpoint is checked by rank 0 without reading its tensors
        (:func:`~shoal.checkpoint.sharded.inspect_sharded`); what comes back holds its epoch, step
        and extra, and :func:`restore` loads the state (collectively, resharded for this job).
        """
        wait_pending()  # an async save in flight is committed (or has failed) before the listing
        chosen: str | None = None
        error: tuple[str, str] | None = None
        payload: dict[str, Any] | None = None
        if collectives.rank() == 0:
            error = self._pointer_problem()
            candidates = [] if error else self.checkpoints()
            for path in reversed(candidates):
                payload, problem = _try_any(path, map_location)
                if problem is None:
                    chosen = str(path)
                    break
                self._warn(f"skipping checkpoint {path}: {problem}")
            if candidates and chosen is None:
                error = (
                    f"none of the {len(candidates)} checkpoint(s) in {self.directory} is valid",
                    "delete the directory's ckpt-*.pt files and ckpt-*.dcp directories to start over, "
                    "or pass --resume never",
                )
        summary = payload if payload is not None and payload.get("sharded") else None
        chosen, error, summary = collectives.broadcast_object((chosen, error, summary))
        if error:
            raise ShoalError(*error)
        if chosen is None:
            return None
        if summary is not None:  # a .dcp: its state is read by restore()
            payload = summary
        elif payload is None:  # ranks other than 0 read the file rank 0 chose
            payload = torch_load(chosen, map_location=map_location)
        return Checkpoint(Path(chosen), payload)

    def _pointer_problem(self) -> tuple[str, str] | None:
        """(message, hint) if the ``latest`` pointer names anything but a checkpoint file of this
        directory (``../outside.pt``, an absolute path, another file): a tampered or foreign pointer
        is refused, nothing is loaded. A pointer one save behind (killed between writing the file
        and moving the pointer) is fine: the newest complete file is loaded."""
        pointer = self.directory / POINTER
        if not pointer.is_file():
            return None
        try:
            named = pointer.read_text(encoding="utf-8", errors="replace").strip()
        except OSError as err:
            return f"cannot read the checkpoint pointer {pointer}: {err.strerror}", "fix its permissions, or delete it"
        match = _NAME.match(named)
        if match and Path(named).name == named:
            target = self.directory / named
            if target.is_file() if match.group(3) == "pt" else is_sharded(target):
                return None
        return (
            f"the checkpoint pointer {pointer} names {named[:200]!r}, which is not a checkpoint file in {self.directory}",
            f"delete {pointer} (the next save writes it again), or pass --resume PATH with the checkpoint to use",
        )

    def load(self, path: str | os.PathLike, map_location: Any = "cpu") -> Checkpoint:
        """Load one given checkpoint (``--resume PATH``): a ``.pt`` file, read by each rank, or a
        ``.dcp`` directory, checked by rank 0 (collective; :func:`restore` then reads its state)."""
        wait_pending()
        path = Path(path)
        if path.is_dir():
            payload, problem = _try_sharded(path) if collectives.rank() == 0 else (None, None)
            payload, problem = collectives.broadcast_object((payload, problem))
        else:
            payload, problem = _try_load(path, map_location)
        if problem:
            raise ShoalError(
                f"cannot resume from {path}: {problem}",
                "pass another checkpoint (a ckpt-*.pt file or ckpt-*.dcp directory), or --resume auto",
            )
        return Checkpoint(path, payload)

    def resume(self, objects: Mapping[str, Any], *, per_rank: Mapping[str, Any] | None = None) -> Checkpoint | None:
        """Load the newest valid checkpoint into ``objects`` (and ``per_rank``); None if there is none.

        The one call a training script needs before its loop::

            ckpt = ctx.checkpointer("ckpts", every="200steps")
            found = ckpt.resume({"model": model, "optimizer": opt, "loader": loader})
            start_epoch = found.extra["epoch"] if found else 0
        """
        checkpoint = self.load_latest()
        if checkpoint is not None:
            restore(checkpoint, objects, per_rank=per_rank)
        return checkpoint

    def load_into(
        self, path: str | os.PathLike, objects: Mapping[str, Any], *, per_rank: Mapping[str, Any] | None = None
    ) -> Checkpoint:
        """:meth:`load` the checkpoint at ``path`` and :func:`restore` it into ``objects``."""
        checkpoint = self.load(path)
        restore(checkpoint, objects, per_rank=per_rank)
        return checkpoint

    def _warn(self, message: str) -> None:
        self.warnings.append(message)
        print(f"shoal: warning: {message}", file=sys.stderr, flush=True)


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
    fsdp_model = _fsdp_model(objects)
    for name, obj in objects.items():
        if fsdp_model is not None and isinstance(obj, torch.optim.Optimizer):
            _load_optimizer_into_fsdp(fsdp_model, obj, saved[name], name, checkpoint.path)
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


def _fsdp_model(objects: Mapping[str, Any]) -> nn.Module | None:
    """The FSDP-sharded model among ``objects``, if any (the optimizers then belong to it)."""
    for obj in objects.values():
        if isinstance(obj, nn.Module) and is_fsdp(unwrap_model(obj)):
            return unwrap_model(obj)
    return None


def _refuse_fsdp(objects: Mapping[str, Any]) -> None:
    if _fsdp_model(objects) is not None:
        raise ShoalError(
            "an FSDP-sharded model is saved as a sharded checkpoint, not a .pt file",
            "create the checkpoint manager with sharded=True (every rank then writes its own shards)",
        )


def _load_optimizer_into_fsdp(model: nn.Module, opt: torch.optim.Optimizer, state: Any, name: str, path: Path) -> None:
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


def _few(keys: list[str], limit: int = 5) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def _state_of(obj: Any) -> Any:
    if isinstance(obj, nn.Module):
        # An exact copy in memory of the weights now, as the trainer may go on updating them.
        return model_state_dict(obj)
    return obj.state_dict()


def _try_any(path: Path, map_location: Any) -> tuple[dict[str, Any] | None, str | None]:
    return _try_sharded(path) if path.suffix == ".dcp" else _try_load(path, map_location)


def _try_sharded(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(summary, None) if the ``.dcp`` directory ``path`` is complete (checked without reading its
    tensors), else (None, problem). The summary is a payload without state: epoch, step, world size
    and extra (the checkpoint's extra values, with the epoch and step the manager added)."""
    try:
        found = inspect_sharded(path)
    except ShoalError as err:
        return None, err.message
    extra = found["extra"]
    match = _NAME.match(path.name)
    try:
        epoch = int(extra["epoch"]) if "epoch" in extra else int(match.group(1))  # type: ignore[union-attr]
        step = int(extra["step"]) if "step" in extra else int(match.group(2))  # type: ignore[union-attr]
    except (AttributeError, TypeError, ValueError):
        return None, "it records no epoch and step"
    summary = {
        "format_version": FORMAT_VERSION,
        "sharded": True,
        "world_size": int(found["meta"]["world_size"]),
        "epoch": epoch,
        "step": step,
        "extra": extra,
    }
    return summary, None


def _try_load(path: Path, map_location: Any) -> tuple[dict[str, Any] | None, str | None]:
    """(payload, None) if ``path`` loads (weights-only) and has every field, else (None, problem)."""
    try:
        payload = torch_load(path, map_location=map_location)
    except Exception as err:  # truncated zip, bad pickle, refused global, I/O error...
        lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
        # torch's weights-only refusal buries the reason in a later line.
        reason = next((line for line in lines if "WeightsUnpickler error" in line), lines[0])
        return None, f"it does not load ({reason[:200]})"
    if not isinstance(payload, dict) or any(key not in payload for key in _REQUIRED):
        return None, "it is not a shoal checkpoint (fields missing)"
    if payload["format_version"] != FORMAT_VERSION:
        return None, f"format version {payload['format_version']} is not {FORMAT_VERSION}"
    return payload, None


def _gather(obj: Any) -> list[Any]:
    """``obj`` from every rank, in rank order (on every rank)."""
    if collectives.world_size() <= 1:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _shoal_version() -> str:
    from shoal import __version__

    return __version__
