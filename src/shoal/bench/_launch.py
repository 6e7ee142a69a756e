"""Starting benchmark workers through shoal's own launcher, with the start method resolved."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shoal.launch.local import START_METHODS, check_start_method, resolve_start_method

__all__ = ["START_METHODS", "check_start_method", "resolve_start_method", "launch_workers"]


def launch_workers(entrypoint: Callable[..., Any], args: tuple[Any, ...], nproc: int, start_method: str) -> Any:
    """``launch_local(entrypoint, args, nproc)``; returns rank 0's return value."""
    from shoal.launch.local import launch_local

    return launch_local(entrypoint, args, nproc, start_method=start_method)[0]
