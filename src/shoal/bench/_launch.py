"""Starting benchmark workers through shoal's own launcher, with the start method resolved."""

from __future__ import annotations

from typing import Any, Callable

from shoal.errors import ShoalError

START_METHODS = ("auto", "fork", "spawn")


def check_start_method(name: str) -> str:
    if name not in START_METHODS:
        raise ShoalError(f"unknown start method {name!r}", f"use one of: {', '.join(START_METHODS)}")
    return name


def resolve_start_method(name: str, device_type: str) -> str:
    """``auto``: fork on CPU (workers inherit the parent's imports: seconds saved per launch on a
    small machine, see ``shoal bench startup``), spawn with CUDA (a CUDA runtime does not survive fork)."""
    check_start_method(name)
    if name != "auto":
        return name
    return "spawn" if device_type == "cuda" else "fork"


def launch_workers(entrypoint: Callable[..., Any], args: tuple[Any, ...], nproc: int, start_method: str) -> Any:
    """``launch_local(entrypoint, args, nproc)``; returns rank 0's return value."""
    from shoal.launch.local import launch_local

    return launch_local(entrypoint, args, nproc, start_method=start_method)[0]
