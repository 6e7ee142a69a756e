"""Starts N real gloo workers (torchrun's environment, no launcher) that report through shoal.progress."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).parent / "launch" / "scripts" / "progress_worker.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_job(progress_dir: Path, nproc: int = 2, **env: str) -> list[subprocess.Popen]:
    """The workers of one job writing into ``progress_dir``; ``env`` as progress_worker.py reads it."""
    port = str(free_port())
    procs = []
    for rank in range(nproc):
        environ = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc))
        environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, SHOAL_PROGRESS_DIR=str(progress_dir))
        environ.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", **env)
        # stderr into a file, not a pipe nobody reads: a full pipe would block the worker (a false hang).
        progress_dir.mkdir(parents=True, exist_ok=True)
        with open(progress_dir / f"worker-{rank}.log", "w") as log:
            procs.append(subprocess.Popen([sys.executable, str(WORKER)], env=environ, stderr=log))
    return procs


def stop_job(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    for proc in procs:
        proc.wait()
