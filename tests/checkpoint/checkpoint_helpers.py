"""What the checkpoint tests and their scripts (``scripts/jobkit.py`` re-exports it) share: a small
checkpointable object and the flattening of a state tree for value-by-value comparison."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any


class Counter:
    """A checkpointable object holding one value (a data position, a per-rank counter...)."""

    def __init__(self, value: Any = 0) -> None:
        self.value = value

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


def flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{dotted name: value} of every leaf of nested dicts, lists and tuples."""
    out = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(flat(v, f"{prefix}{k}."))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            out.update(flat(v, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = tree
    return out


def load_in_this_process(script: Path, *args: str) -> None:
    """``script``'s ``load`` job in the test's own process: one plain process, no process group (the
    test's RNG state kept), instead of a fresh interpreter importing torch."""
    import torch
    import torch.distributed as dist

    spec = importlib.util.spec_from_file_location(script.stem, script)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(script.parent))  # for the script's own imports (jobkit)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(script.parent))
    assert not dist.is_initialized()
    with torch.random.fork_rng(devices=[]):
        module.load(*args)
