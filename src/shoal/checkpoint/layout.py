"""What a sharded checkpoint looks like on disk, told without torch: the CLI checks ``--resume PATH``
with it before torch loads (:func:`shoal.train.config.check_resume`)."""

from __future__ import annotations

import os
from pathlib import Path

META = "shoal.json"
"""shoal's own description of a sharded checkpoint, beside DCP's ``.metadata``."""


def is_sharded(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a committed sharded checkpoint directory (cheap: no reading of shards)."""
    return Path(path).is_dir() and (Path(path) / META).is_file() and (Path(path) / ".metadata").is_file()
