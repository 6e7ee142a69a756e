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

Here: when to save, saving, retention, choosing what to load. Beside it: the directory's names,
listing, pointer and validity (:mod:`shoal.checkpoint.files`), a loaded :class:`Checkpoint` and
:func:`restore` (:mod:`shoal.checkpoint.loading`), the ``.pt`` <-> FSDP crossing
(:mod:`shoal.checkpoint.crossing`); :class:`Checkpoint`, :func:`restore`, :data:`POINTER` and
:data:`FORMAT_VERSION` are re-exported here.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from shoal.atomic import TMP_PREFIX, atomic_write_text, remove_temporaries
from shoal.checkpoint.cadence import Cadence
from shoal.checkpoint.crossing import refuse_fsdp
from shoal.checkpoint.files import (
    FORMAT_VERSION,
    POINTER,
    list_checkpoints,
    pointer_problem,
    try_checkpoint,
    try_load,
    try_sharded,
)
from shoal.checkpoint.loading import Checkpoint, restore
from shoal.checkpoint.rng import capture_rng
from shoal.checkpoint.sharded import save_sharded, wait_pending
from shoal.checkpoint.sharded_files import checkpoint_name, remove_stale
from shoal.checkpoint.storage import atomic_torch_save, torch_load
from shoal.distributed import collectives
from shoal.distributed.wrap import model_state_dict
from shoal.errors import ShoalError

__all__ = ["FORMAT_VERSION", "POINTER", "Checkpoint", "CheckpointManager", "restore"]


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
        refuse_fsdp(objects)
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
        return list_checkpoints(self.directory)

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
            error = pointer_problem(self.directory)
            candidates = [] if error else self.checkpoints()
            for path in reversed(candidates):
                payload, problem = try_checkpoint(path, map_location)
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

    def load(self, path: str | os.PathLike, map_location: Any = "cpu") -> Checkpoint:
        """Load one given checkpoint (``--resume PATH``): a ``.pt`` file, read by each rank, or a
        ``.dcp`` directory, checked by rank 0 (collective; :func:`restore` then reads its state)."""
        wait_pending()
        path = Path(path)
        if path.is_dir():
            payload, problem = try_sharded(path) if collectives.rank() == 0 else (None, None)
            payload, problem = collectives.broadcast_object((payload, problem))
        else:
            payload, problem = try_load(path, map_location)
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


def _state_of(obj: Any) -> Any:
    if isinstance(obj, nn.Module):
        # An exact copy in memory of the weights now, as the trainer may go on updating them.
        return model_state_dict(obj)
    return obj.state_dict()


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
