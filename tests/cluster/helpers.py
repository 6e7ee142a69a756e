"""Start ``shoal`` commands on namespaced nodes and collect what they did."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import warm
from cluster.netns import Node
from procs import launcher_free_env

SCRIPTS = Path(__file__).parent / "scripts"
STEPS = str(SCRIPTS / "steps.py")
# Variables that would decide for shoal what these tests check that it decides by itself (beyond a
# launcher's, which procs.launcher_free_env drops).
_DROP = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "SHOAL_INIT_TIMEOUT", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE")


def clean_env(**extra: str) -> dict[str, str]:
    """A user's environment (:func:`procs.launcher_free_env`) without what these tests check that shoal decides."""
    return launcher_free_env(drop=_DROP, **extra)


@dataclass
class Launched:
    """One ``shoal`` command running on a node; its output goes to a file."""

    node: Node | None
    proc: subprocess.Popen
    log: Path
    started: float
    ended: float | None = None
    marked: float | None = None
    """When the output first held ``wait_all``'s ``mark`` (e.g. the start-up line)."""

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def elapsed(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def wait(self, timeout: float) -> "Launched":
        try:
            self.proc.wait(timeout=timeout)
        finally:
            self.ended = time.monotonic()
        return self


def shoal_on(
    node: Node | None, args: Sequence[str], log: Path, *, cwd: Path | None = None, env: dict[str, str] | None = None
) -> Launched:
    """Start ``python -m shoal ARGS`` in ``node`` (or here, for None), output into ``log``."""
    cmd = [sys.executable, "-m", "shoal", *args]
    with open(log, "w") as out:
        kw = dict(stdout=out, stderr=subprocess.STDOUT, env=env or clean_env(), cwd=cwd)
        started = time.monotonic()
        proc = node.popen(cmd, **kw) if node is not None else warm.popen(cmd, **kw)
    return Launched(node, proc, log, started)


def wait_all(launched: Sequence[Launched], timeout: float, mark: str | None = None) -> list[Launched]:
    """Wait for every command (one shared deadline); the output of all of them on failure.

    ``mark``: note when each command's output first contains it (``Launched.marked``), to time
    what follows start-up, which a busy machine can stretch arbitrarily.
    """
    deadline = time.monotonic() + timeout
    while True:
        now = time.monotonic()
        for item in launched:
            if mark is not None and item.marked is None and mark in item.output:
                item.marked = now
            if item.ended is None and item.proc.poll() is not None:
                item.ended = now
        if all(item.ended is not None for item in launched):
            return list(launched)
        if now > deadline:
            raise AssertionError(f"still running after {timeout} s:\n" + describe(launched))
        time.sleep(0.1)


def describe(launched: Sequence[Launched]) -> str:
    return "\n".join(
        f"===== {item.node.name if item.node else 'here'} rc={item.returncode} "
        f"after {item.elapsed:.1f} s\n{item.output[-6000:]}"
        for item in launched
    )


def results(out_dir: Path, n: int) -> list[dict]:
    found = sorted(out_dir.glob("rank*.json"))
    assert len(found) == n, f"expected {n} result files, got {[p.name for p in found]}"
    return sorted((json.loads(p.read_text()) for p in found), key=lambda r: r["rank"])
