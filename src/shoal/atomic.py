"""Writing files so that a crash at any instant leaves either the old file or the new one.

Every write goes to a temporary file in the target's directory, is flushed and fsynced, then moved
over the target with ``os.replace`` (atomic on POSIX), and the directory is fsynced so the rename
itself survives a power cut. Torch-free: checkpoints, the watchdog's verdict, rendered launch files
and benchmark reports all write through here.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

TMP_PREFIX = ".tmp-"
"""How the temporary files of :func:`atomic_write` start (followed by the target's name)."""


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], None], *, mode: int | None = None) -> Path:
    """Call ``write(fileobj)`` on a temporary file and atomically move it to ``path`` (with the
    permission bits ``mode``, if given, before it appears)."""
    target = Path(path)
    directory = target.parent
    fd, tmp_name = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{target.name}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp_name, mode)
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


def atomic_write_text(path: str | os.PathLike, text: str, *, mode: int | None = None) -> Path:
    return atomic_write(path, lambda f: f.write(text.encode()), mode=mode)


def remove_temporaries(directory: str | os.PathLike, target_glob: str) -> None:
    """Delete what :func:`atomic_write` runs that were killed left behind for targets matching
    ``target_glob`` (a SIGKILL skips its clean-up). Only for a directory no other writer is using."""
    for stale in Path(directory).glob(f"{TMP_PREFIX}{target_glob}.*"):
        if not stale.is_dir():  # a killed sharded save's directory is sharded.remove_stale's
            stale.unlink(missing_ok=True)


def fsync_dir(directory: str | os.PathLike) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
