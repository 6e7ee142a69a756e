"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP): every rank writes its own shards.

A sharded checkpoint is a directory (``ckpt-e<epoch>-s<step>.dcp`` when the checkpoint manager
names it) holding DCP's files (``__<rank>_0.distcp`` per rank and ``.metadata``) and ``shoal.json``
(format version, world size, versions). What it holds:

* the model and its optimizers (those that have stepped: a fresh one has no state and stays fresh),
  through DCP's ``get_state_dict`` / ``set_state_dict``: keys are the
  parameters' plain names (no ``module.``, no FSDP wrapper), the optimizer state is keyed by them,
  and DCP reads whatever slice each rank needs. So a DDP checkpoint loads into an FSDP model and the
  other way round, and a checkpoint written by N ranks loads on M ranks (resharding);
* ``objects``: anything else with ``state_dict()`` / ``load_state_dict()`` that is the same on every
  rank (data position, step counters): rank 0's state is saved, as the checkpoint manager does;
* ``per_rank`` objects and every rank's RNG states, one entry per rank. As with the manager, they
  come back only when the world size is unchanged; on another world size the ranks keep the state
  they were seeded with (the data position, in ``objects``, is restored either way);
* ``extra``: plain values (epoch, step...).

Atomic: the ranks write into ``.tmp-<name>`` beside the final directory; once every rank's shards
and DCP's metadata are durable (DCP fsyncs every file), rank 0 fsyncs the directory, renames it to
its final name and fsyncs the parent. A kill at any instant leaves the previous checkpoint loadable
and the partial one invisible under a ``.tmp-`` name, removed by the next save in that parent.

Safe to load: DCP unpickles non-tensor values with ``weights_only=False``; here every load uses
``weights_only=True`` (:class:`~shoal.checkpoint.dcp_support.SafeLoadPlanner`), so a checkpoint
cannot run code.

Async (``async_=True``): DCP's ``async_save`` copies the state into host memory (the only time the
training step is blocked) and writes it from a background thread; the rename, and the caller's
``on_commit`` (the ``latest`` pointer, retention), happen on rank 0 when every rank has written.
Only one save is in flight: the next save or load waits for the previous one. The checkpoint
collectives run on a process group of their own (gloo), so a background save never interleaves
with the training's collectives on the default group.

Checking a checkpoint without loading it, its name and listing: :mod:`shoal.checkpoint.sharded_files`
(re-exported here).

DCP itself, and :mod:`shoal.checkpoint.dcp_support` which imports it, are imported by the functions
that save and load: importing DCP imports DTensor and sympy (0.5 CPU-s), which every process that
imports the checkpoint manager would otherwise pay, sharded checkpoint or not.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from shoal.atomic import TMP_PREFIX, fsync_dir
from shoal.checkpoint.rng import capture_rng, restore_rng
from shoal.checkpoint.sharded_files import (
    FORMAT,
    FORMAT_VERSION,
    META,
    SUFFIX,
    checkpoint_name,
    inspect_sharded,
    is_sharded,
    read_meta,
    remove_stale,
    sharded_checkpoints,
)
from shoal.distributed import collectives
from shoal.errors import ShoalError, first_line

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "META",
    "SUFFIX",
    "PendingSave",
    "ShardedCheckpoint",
    "checkpoint_name",
    "inspect_sharded",
    "is_sharded",
    "load_sharded",
    "read_meta",
    "remove_stale",
    "save_sharded",
    "sharded_checkpoints",
    "wait_pending",
]


@dataclass
class ShardedCheckpoint:
    """A loaded sharded checkpoint: where it came from, who wrote it, its ``extra`` values."""

    path: Path
    world_size: int
    extra: dict[str, Any]
    per_rank_restored: bool
    """Whether this rank's per-rank objects and RNG states came back (same world size)."""


@dataclass
class PendingSave:
    """A save in progress (async) or done (sync). ``wait()`` returns once it is committed."""

    path: Path
    blocked_s: float = 0.0
    """Seconds the caller was blocked in :func:`save_sharded` (for an async save: planning and the
    copy to host memory)."""
    _committed: Future = field(default_factory=Future)

    def done(self) -> bool:
        return self._committed.done()

    def wait(self) -> Path:
        """Block until the checkpoint is written (and, on rank 0, renamed into place); raise a
        :class:`ShoalError` if the background save failed."""
        from torch.distributed.checkpoint.api import CheckpointException

        try:
            self._committed.result()
        except ShoalError:
            raise
        except (Exception, CheckpointException) as err:
            raise _save_failed(self.path, err) from None
        return self.path


def _save_failed(path: Path, err: BaseException) -> ShoalError:
    from shoal.checkpoint.dcp_support import dcp_reason

    return ShoalError(
        f"saving the checkpoint {path} failed: {dcp_reason(err)}",
        "check the disk (space, permissions); the previous checkpoint is intact",
    )


_pending: PendingSave | None = None


def wait_pending() -> None:
    """Wait for the async save in flight, if any (call before exiting, on every rank)."""
    global _pending
    if _pending is not None:
        pending, _pending = _pending, None
        pending.wait()


def save_sharded(
    directory: str | os.PathLike,
    state: Mapping[str, Any],
    *,
    per_rank: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    async_: bool = False,
    on_commit: Callable[[Path], None] | None = None,
) -> PendingSave:
    """Write ``state`` (a model, its optimizers, other stateful objects) as a sharded checkpoint in
    ``directory``. Collective: every rank calls it with the same names.

    Sync: returns once the checkpoint is committed on every rank. Async: returns after the copy to
    host memory; ``.wait()`` on the result (or the next save, or :func:`wait_pending`) waits for
    the commit. ``on_commit(path)`` runs on rank 0 right after the rename (the ``latest`` pointer and
    retention go there). An existing checkpoint of the same name is replaced.
    """
    global _pending
    wait_pending()
    started = time.perf_counter()
    final = Path(directory)
    tmp = final.parent / f"{TMP_PREFIX}{final.name}"
    model, optimizers, objects = _split(state)
    # An optimizer that has not stepped yet has no state. DCP's get_state_dict would make some by
    # stepping it once with zero gradients (torch's _init_optim_state), which moves Adam's step
    # counter: resuming would not be exact. Such optimizers are left out and stay fresh on load.
    stepped = [i for i, opt in enumerate(optimizers) if opt.state]
    meta = {"has_model": model is not None, "optimizers": len(optimizers), "stepped_optimizers": stepped}
    _open_temporary(tmp, final, meta)
    from shoal.checkpoint.dcp_support import checkpoint_group, quiet_single_process

    group = checkpoint_group()
    to_save = _dcp_state(model, [optimizers[i] for i in stepped])
    to_save["shoal"] = _shoal_blob(objects, per_rank, extra)
    collectives.barrier()  # the temporary directory exists before anyone writes into it
    if group is None:
        quiet_single_process()
    pending = PendingSave(final)
    if async_:
        _write_in_background(to_save, tmp, group, on_commit, pending)
        _pending = pending
    else:
        _write_now(to_save, tmp, final, group, on_commit)
        pending._committed.set_result(final)
    pending.blocked_s = time.perf_counter() - started
    return pending


def _open_temporary(tmp: Path, final: Path, meta: dict[str, Any]) -> None:
    """Rank 0 makes the temporary directory with ``shoal.json`` (``meta`` and the versions); every
    rank learns of its failure here, instead of waiting for rank 0 in a collective."""
    problem = None
    if collectives.rank() == 0:
        world, torch_version = collectives.world_size(), str(torch.__version__)
        versions = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "world_size": world,
            "torch_version": torch_version,
        }
        try:
            _prepare(tmp, {**versions, **meta})
        except OSError as err:
            problem = f"cannot write the checkpoint {final}: {err.strerror or err} ({err.filename or tmp.parent})"
    problem = collectives.broadcast_object(problem)
    if problem:
        raise ShoalError(problem, "check the checkpoint directory's permissions and free space")


def _write_now(
    to_save: dict[str, Any], tmp: Path, final: Path, group: Any, on_commit: Callable[[Path], None] | None
) -> None:
    """Sync: every rank writes its shards into ``tmp``; rank 0 renames it to ``final`` once all have."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    writer = dcp.FileSystemWriter(str(tmp), sync_files=True)
    try:
        dcp.save(to_save, storage_writer=writer, process_group=group, no_dist=group is None)
    except (Exception, CheckpointException) as err:
        raise _save_failed(final, err) from None
    if collectives.rank() == 0:
        _commit(tmp, final, on_commit)
    collectives.barrier()


def _write_in_background(
    to_save: dict[str, Any], tmp: Path, group: Any, on_commit: Callable[[Path], None] | None, pending: PendingSave
) -> None:
    """Async: returns after DCP's copy to host memory. DCP's writer thread writes the shards; once
    every rank has, rank 0 renames ``tmp``, and ``pending`` learns the outcome."""
    import torch.distributed.checkpoint as dcp

    writer = dcp.FileSystemWriter(str(tmp), sync_files=True)
    upload = dcp.async_save(to_save, storage_writer=writer, process_group=group, no_dist=group is None)
    upload = getattr(upload, "upload_completion", upload)  # an AsyncSaveResponse with a custom stager
    rank = collectives.rank()

    def finished(future: Future) -> None:
        # Runs in DCP's writer thread once every rank has written and DCP's metadata is durable.
        try:
            future.result()
            if rank == 0:
                _commit(tmp, pending.path, on_commit)
            pending._committed.set_result(pending.path)
        except BaseException as err:  # handed to wait()
            pending._committed.set_exception(err)

    upload.add_done_callback(finished)


def load_sharded(
    directory: str | os.PathLike,
    state: Mapping[str, Any],
    *,
    per_rank: Mapping[str, Any] | None = None,
) -> ShardedCheckpoint:
    """Load the checkpoint in ``directory`` into ``state`` (and ``per_rank``), resharding the model
    and optimizer for this job's world size and wrapping (DDP, FSDP, none). Collective."""
    wait_pending()
    path = Path(directory)
    meta = read_meta(path)
    model, optimizers, objects = _split(state)
    if model is None and optimizers:
        raise ShoalError("load_sharded got optimizers without their model", "pass the model in the same state dict")
    if model is not None and not meta.get("has_model"):
        raise ShoalError(f"checkpoint {path} holds no model", "resume with the kind of run that wrote it")
    if optimizers and len(optimizers) != meta.get("optimizers", 0):
        raise ShoalError(
            f"checkpoint {path} holds {meta.get('optimizers', 0)} optimizer(s), {len(optimizers)} given",
            "resume with the same configuration that wrote it, or start a new --out",
        )
    optimizers = [optimizers[i] for i in meta.get("stepped_optimizers", [])] if optimizers else []
    to_load = _dcp_state(model, optimizers)
    to_load["shoal"] = b""

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from shoal.checkpoint.dcp_support import SafeLoadPlanner, checkpoint_group, dcp_reason, quiet_single_process

    single = not collectives.is_initialized()
    if single:
        quiet_single_process()
    try:
        dcp.load(
            to_load,
            storage_reader=dcp.FileSystemReader(str(path)),
            planner=SafeLoadPlanner(),
            process_group=checkpoint_group(),
            no_dist=single,
        )
    except (Exception, CheckpointException) as err:
        raise ShoalError(
            f"checkpoint {path} does not fit this model or optimizer: {dcp_reason(err)}",
            "resume with the model and optimizer that wrote it, or start a new --out",
        ) from None
    if model is not None:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(model, optimizers, model_state_dict=to_load["model"], optim_state_dict=to_load.get("optim", {}))
    try:
        blob = torch.load(io.BytesIO(to_load["shoal"]), weights_only=True)
    except Exception as err:  # a value that would run code when unpickled, or damage
        raise ShoalError(
            f"checkpoint {path} holds state that does not load safely: {first_line(err)}",
            "save only tensors and plain Python values in objects, per_rank and extra",
        ) from None
    missing = [name for name in objects if name not in blob["objects"]]
    if missing:
        raise ShoalError(
            f"checkpoint {path} has no state for {', '.join(missing)}",
            "resume with the same kind of run that wrote it, or start a new --out",
        )
    for name, obj in objects.items():
        obj.load_state_dict(blob["objects"][name])
    ranks = blob["ranks"]
    rank = collectives.rank()
    restored = meta["world_size"] == collectives.world_size() and rank < len(ranks)
    if restored:
        mine = ranks[rank]
        for name, obj in (per_rank or {}).items():
            if name in mine["objects"]:
                obj.load_state_dict(mine["objects"][name])
        restore_rng(mine["rng"])
    return ShardedCheckpoint(path, int(meta["world_size"]), dict(blob["extra"]), restored)


def _prepare(tmp: Path, meta: dict[str, Any]) -> None:
    """Rank 0: an empty temporary directory beside the final one, holding ``shoal.json``."""
    tmp.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(tmp.parent)
    shutil.rmtree(tmp, ignore_errors=True)  # a killed save of the same name (any name)
    tmp.mkdir()
    with open(tmp / META, "w") as f:
        json.dump(meta, f)
        f.flush()
        os.fsync(f.fileno())


def _commit(tmp: Path, final: Path, on_commit: Callable[[Path], None] | None) -> None:
    fsync_dir(tmp)
    old = None
    if final.exists():  # the same name saved again: move the old one aside, drop it after
        old = final.parent / f"{TMP_PREFIX}{final.name}.old"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    if on_commit is not None:
        on_commit(final)


def _split(state: Mapping[str, Any]) -> tuple[nn.Module | None, list[torch.optim.Optimizer], dict[str, Any]]:
    models = [obj for obj in state.values() if isinstance(obj, nn.Module)]
    if len(models) > 1:
        raise ShoalError(
            f"a sharded checkpoint holds one model, got {len(models)}",
            "wrap the models in one nn.Module (or nn.ModuleDict) and pass that",
        )
    optimizers = [obj for obj in state.values() if isinstance(obj, torch.optim.Optimizer)]
    objects = {name: obj for name, obj in state.items() if not isinstance(obj, (nn.Module, torch.optim.Optimizer))}
    return (models[0] if models else None), optimizers, objects


def _dcp_state(model: nn.Module | None, optimizers: list[torch.optim.Optimizer]) -> dict[str, Any]:
    """The model's and optimizers' state as DCP saves it: plain parameter names, each rank's shards."""
    if model is None:
        return {}
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizers)
    return {"model": model_sd, "optim": optim_sd} if optimizers else {"model": model_sd}


def _shoal_blob(
    objects: Mapping[str, Any], per_rank: Mapping[str, Any] | None, extra: Mapping[str, Any] | None
) -> bytes:
    """One serialized value, the same on every rank: rank 0's objects and extra, every rank's own
    per-rank state and RNG. Serialized here (torch.save) so loading it is ``weights_only``."""
    import torch.distributed as dist

    mine = {"rng": capture_rng(), "objects": {name: obj.state_dict() for name, obj in (per_rank or {}).items()}}
    if collectives.world_size() > 1:
        ranks: list[Any] = [None] * collectives.world_size()
        dist.all_gather_object(ranks, mine)
    else:
        ranks = [mine]
    shared = {name: obj.state_dict() for name, obj in objects.items()} if collectives.rank() == 0 else None
    shared, extra = collectives.broadcast_object((shared, dict(extra or {})))
    buffer = io.BytesIO()
    torch.save({"objects": shared, "extra": extra, "ranks": ranks}, buffer)
    return buffer.getvalue()
