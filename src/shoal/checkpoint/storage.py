"""Writing files so that a crash at any instant leaves either the old file or the new one.

Every write goes to a temporary file in the target's directory, is flushed and fsynced, then moved
over the target with ``os.replace`` (atomic on POSIX), and the directory is fsynced so the rename
itself survives a power cut.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

TMP_PREFIX = ".tmp-"


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], None]) -> Path:
    """Call ``write(fileobj)`` on a temporary file and atomically move it to ``path``."""
    target = Path(path)
    directory = target.parent
    fd, tmp_name = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{target.name}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        # Never leave a half-written temporary behind (a kill -9 can, and the next save cleans it).
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(directory)
    return target


def remove_temporaries(directory: str | os.PathLike, target_glob: str) -> None:
    """Delete what :func:`atomic_write` runs that were killed left behind for targets matching
    ``target_glob`` (a SIGKILL skips its clean-up). Only for a directory no other writer is using."""
    for stale in Path(directory).glob(f"{TMP_PREFIX}{target_glob}.*"):
        if not stale.is_dir():  # a killed sharded save's directory is sharded.remove_stale's
            stale.unlink(missing_ok=True)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda f: f.write(text.encode()))


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save(obj)`` to ``path``, atomically and durably."""
    return atomic_write(path, lambda f: torch.save(obj, f))


def fsync_dir(directory: str | os.PathLike) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def torch_load(path: str | os.PathLike, map_location: Any = "cpu") -> Any:
    """Load with ``weights_only=True``: a file that would run code when unpickled is refused."""
    return torch.load(path, map_location=map_location, weights_only=True)
