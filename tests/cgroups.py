"""A memory cgroup for a test: a fresh child of this process's (v1 or v2) with a memory limit and no
swap, and a command started inside it (so that the kernel's OOM killer acts on it alone)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def memory_cgroup(limit: int, tag: str) -> Iterator[str]:
    """The directory of a fresh child of this process's memory cgroup limited to ``limit`` bytes
    (swap included), removed afterwards; the test is skipped where there is none or the kernel
    refuses it. ``tag`` goes into its name."""
    from shoal.launch.oom import memory_state

    state = memory_state()
    if state.directory is None:
        pytest.skip("no memory cgroup with an OOM kill counter is readable here")
    child = os.path.join(state.directory, f"shoal-{tag}-{os.getpid()}-{time.monotonic_ns()}")
    v2 = os.path.exists(os.path.join(state.directory, "memory.events"))
    try:
        if v2:
            with open(os.path.join(state.directory, "cgroup.subtree_control"), "w") as f:
                f.write("+memory")
        os.mkdir(child)
        names = ["memory.max", "memory.swap.max"] if v2 else ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"]
        for name, value in zip(names, [limit, 0 if v2 else limit]):
            if os.path.exists(os.path.join(child, name)):
                with open(os.path.join(child, name), "w") as f:
                    f.write(str(value))
    except OSError as err:
        if os.path.isdir(child):
            os.rmdir(child)
        pytest.skip(f"the kernel refuses a child memory cgroup with a limit here: {err}")
    try:
        yield child
    finally:
        deadline = time.monotonic() + 30
        while True:  # the last processes may still be exiting
            try:
                os.rmdir(child)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def run_in_cgroup(
    cgroup: str, cmd: list[str], *, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``cmd`` started inside ``cgroup`` (it joins before it starts: its children are born there, and
    every page of theirs and its own counts against the limit), outside any launcher's job
    (``env``: variables added); its output captured as text."""
    wrapped = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup, *cmd]
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SHOAL_ENV")}
    return subprocess.run(wrapped, capture_output=True, text=True, timeout=timeout, env={**clean, **(env or {})})
