"""The other frameworks some benchmarks run beside shoal: a row each, when its package is installed."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

PEERS = {"accelerate": "accelerate", "fabric": "lightning"}
"""Variants that run another framework -> the package each needs (``pip install -r benchmarks/requirements.txt``)."""


def skip_missing_peers(variants: Iterable[str]) -> tuple[list[str], list[str]]:
    """``variants`` without those whose framework (:data:`PEERS`) is not installed, and a note for each."""
    kept, notes = [], []
    for name in variants:
        package = PEERS.get(name)
        if package and importlib.util.find_spec(package) is None:
            notes.append(f"{name}: skipped, {package} is not installed (pip install -r benchmarks/requirements.txt)")
        else:
            kept.append(name)
    return kept, notes
