"""A sharded checkpoint's directory seen from outside, without a collective: its format record
(``shoal.json``), its name, whether it is committed, the listing of a parent's, the check that it is
complete without loading its tensors (:func:`inspect_sharded`), and the temporaries of killed saves.
Saving and loading are :mod:`shoal.checkpoint.sharded`'s."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from shoal.atomic import TMP_PREFIX
from shoal.checkpoint.layout import META, is_sharded
from shoal.errors import ShoalError, first_line

FORMAT = "shoal-sharded"
FORMAT_VERSION = 1
SUFFIX = ".dcp"
"""The suffix the checkpoint manager gives a sharded checkpoint's directory (``ckpt-e00001-s000000100.dcp``)."""
_NAME = re.compile(r"^ckpt-e(\d+)-s(\d+)\.dcp$")


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """``shoal.json`` of a sharded checkpoint, or a :class:`ShoalError` saying why it is not one."""
    meta_path = Path(path) / META
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise ShoalError(
            f"{path} is not a shoal sharded checkpoint (no {META})",
            "pass a ckpt-*.dcp directory written by shoal",
        ) from None
    except (OSError, ValueError) as err:
        raise ShoalError(f"cannot read {meta_path}: {first_line(err)}", "pass another checkpoint") from None
    if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
        raise ShoalError(
            f"{path} has format {meta.get('format')!r} version {meta.get('format_version')!r}, "
            f"not {FORMAT!r} version {FORMAT_VERSION}",
            "load it with the shoal version that wrote it",
        )
    if not (Path(path) / ".metadata").is_file():
        raise ShoalError(f"{path} is incomplete (no DCP .metadata)", "delete it and resume from an older checkpoint")
    return meta


def inspect_sharded(path: str | os.PathLike) -> dict[str, Any]:
    """Check a sharded checkpoint without loading its tensors, in one process (no collective), and
    return ``{"meta": shoal.json, "extra": its extra values}``; a :class:`ShoalError` says what is
    wrong. Checked: ``shoal.json``, DCP's ``.metadata`` (it unpickles), every shard file it names
    present and long enough for every item it holds (a truncated or missing shard), and the small
    shoal record (extra, per-rank state) loading with ``weights_only``. Bytes flipped inside a
    shard are not detected (DCP keeps no checksums): the load itself reports what it can."""
    path = Path(path)
    meta = read_meta(path)

    # Here, not at the top: importing DCP imports DTensor and sympy (0.5 CPU-s), which every
    # process that imports the checkpoint manager would pay for a sharded checkpoint it may never read.
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from shoal.checkpoint.dcp_support import SafeLoadPlanner, dcp_reason, quiet_single_process

    reader = dcp.FileSystemReader(str(path))
    try:
        metadata = reader.read_metadata()
    except Exception as err:  # truncated or damaged pickle
        raise ShoalError(f"{path} has an unreadable DCP .metadata: {first_line(err)}", "delete it") from None
    needed: dict[str, int] = {}
    for info in (getattr(metadata, "storage_data", None) or {}).values():
        end = int(info.offset) + int(info.length)
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for name, end in sorted(needed.items()):
        try:
            size = (path / name).stat().st_size
        except OSError:
            raise ShoalError(f"{path} is incomplete: shard {name} is missing", "delete it") from None
        if size < end:
            raise ShoalError(f"{path} is truncated: shard {name} has {size} of {end} bytes", "delete it")
    state: dict[str, Any] = {"shoal": b""}
    try:
        quiet_single_process()
        dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=True)
        blob = torch.load(io.BytesIO(state["shoal"]), weights_only=True)
        extra = dict(blob["extra"])
    except (Exception, CheckpointException) as err:
        raise ShoalError(f"{path} holds a record that does not load safely: {dcp_reason(err)}", "delete it") from None
    return {"meta": meta, "extra": extra}


def checkpoint_name(epoch: int, step: int) -> str:
    """The directory name the checkpoint manager's files would have: ``ckpt-e00001-s000000100.dcp``."""
    return f"ckpt-e{int(epoch):05d}-s{int(step):09d}{SUFFIX}"


def sharded_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """The committed sharded checkpoints in ``directory``, oldest first (by epoch, then step);
    temporaries (``.tmp-``) and incomplete directories are not listed."""
    found = []
    for path in Path(directory).glob(f"ckpt-*{SUFFIX}") if Path(directory).is_dir() else []:
        match = _NAME.match(path.name)
        if match and is_sharded(path):
            found.append(((int(match.group(1)), int(match.group(2))), path))
    return [path for _, path in sorted(found)]


def remove_stale(parent: str | os.PathLike) -> None:
    """Delete the ``.tmp-ckpt-*`` directories that saves killed half-way left in ``parent``. Only
    when no save into ``parent`` is in flight (:func:`save_sharded` waits for its own first)."""
    for stale in Path(parent).glob(f"{TMP_PREFIX}ckpt-*"):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
