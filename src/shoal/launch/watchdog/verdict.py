"""The monitor's verdict file (:data:`VERDICT_FILE`) in the progress directory, which the trainer reads
at each epoch: the stragglers named now and the current hang, if any."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

VERDICT_FILE = "verdict.json"
"""The monitor's verdict in the progress directory, rewritten (tmp + rename) whenever it changes:
``{"time": unix s, "stragglers": [{"rank", "node", "ratio", "line"}], "hang": null or {"line"}}``.
The trainer reads it at each epoch (stragglers in metrics.jsonl)."""


def write_verdict(path: str | os.PathLike, stragglers: Sequence[dict], hang_line: str | None) -> None:
    """:data:`VERDICT_FILE`'s content, written atomically (a reader sees the old or the new one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "time": time.time(),
        "stragglers": list(stragglers),
        "hang": None if hang_line is None else {"line": hang_line},
    }
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    temporary.write_text(json.dumps(data) + "\n")
    os.replace(temporary, path)
