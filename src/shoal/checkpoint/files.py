"""The checkpoints of a directory: their names (``ckpt-e<epoch>-s<step>.pt`` or ``.dcp``), the listing
in (epoch, step) order, the ``latest`` pointer checked, and whether one candidate is valid, found
without trusting it (a ``.pt`` loaded ``weights_only``, a ``.dcp`` inspected without its tensors)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from shoal.checkpoint.sharded_files import inspect_sharded, is_sharded
from shoal.checkpoint.storage import torch_load
from shoal.errors import ShoalError

FORMAT_VERSION = 1
POINTER = "latest"
_NAME = re.compile(r"^ckpt-e(\d+)-s(\d+)\.(pt|dcp)$")
_REQUIRED = ("format_version", "epoch", "step", "state", "world_size")


def list_checkpoints(directory: Path) -> list[Path]:
    """Checkpoints in ``directory``, oldest first (by epoch, then step): ``.pt`` files and committed
    ``.dcp`` directories together (of the same epoch and step, the ``.pt`` counts as the newer)."""
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = _NAME.match(path.name)
        if match and (match.group(3) == "pt" or is_sharded(path)):
            found.append(((int(match.group(1)), int(match.group(2)), match.group(3)), path))
    return [path for _, path in sorted(found)]


def pointer_problem(directory: Path) -> tuple[str, str] | None:
    """(message, hint) if the ``latest`` pointer names anything but a checkpoint file of ``directory``
    (``../outside.pt``, an absolute path, another file): a tampered or foreign pointer is refused,
    nothing is loaded. A pointer one save behind (killed between writing the file and moving the
    pointer) is fine: the newest complete file is loaded."""
    pointer = directory / POINTER
    if not pointer.is_file():
        return None
    try:
        named = pointer.read_text(encoding="utf-8", errors="replace").strip()
    except OSError as err:
        return f"cannot read the checkpoint pointer {pointer}: {err.strerror}", "fix its permissions, or delete it"
    match = _NAME.match(named)
    if match and Path(named).name == named:
        target = directory / named
        if target.is_file() if match.group(3) == "pt" else is_sharded(target):
            return None
    return (
        f"the checkpoint pointer {pointer} names {named[:200]!r}, which is not a checkpoint file in {directory}",
        f"delete {pointer} (the next save writes it again), or pass --resume PATH with the checkpoint to use",
    )


def try_checkpoint(path: Path, map_location: Any) -> tuple[dict[str, Any] | None, str | None]:
    """:func:`try_sharded` for a ``.dcp`` directory, :func:`try_load` for a ``.pt`` file."""
    return try_sharded(path) if path.suffix == ".dcp" else try_load(path, map_location)


def try_sharded(path: Path) -> tuple[dict[str, Any] | None, str | None]:
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


def try_load(path: Path, map_location: Any) -> tuple[dict[str, Any] | None, str | None]:
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
