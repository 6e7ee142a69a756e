"""Helpers for tests that start ``shoal`` runs and interrupt them: waiting, finding workers, signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import warm
from shoal.stopping import stop_with_grace

LAUNCHER_PREFIXES = ("OMPI_", "PMI_", "PMIX_", "SLURM_", "PET_", "TORCHELASTIC_", "GROUP_", "ROLE_", "HOROVOD_")
"""Variables a launcher (mpirun, srun, torchrun's agent, a Kubeflow operator, horovodrun) leaves."""
JOB_NAMES = ("SHOAL_ENV", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
"""The job's own coordinates: a test's command must find its own, never inherit another job's."""


def launcher_free_env(*, drop: tuple[str, ...] = (), **extra: str) -> dict[str, str]:
    """This environment as a user's shell has it: no launcher's variables, no job coordinates, no
    OMP_NUM_THREADS (shoal decides threads), this venv's bin first on PATH (an mpirun or srun rank
    runs ``shoal`` and ``python`` by name); then the names in ``drop`` removed (a name, or a prefix
    ending in ``_``) and ``extra`` set."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(LAUNCHER_PREFIXES) and k not in JOB_NAMES and k != "OMP_NUM_THREADS"
        and not any(k == d or (d.endswith("_") and k.startswith(d)) for d in drop)
    }  # fmt: skip
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    env.update(extra)
    return env


def start(*args: str, **kwargs) -> subprocess.Popen:
    """``python -m shoal ARGS`` in its own session (so its whole process group can be killed)."""
    return start_cmd(sys.executable, "-m", "shoal", *args, **kwargs)


def start_cmd(*cmd: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
    """``cmd`` in its own session, both streams piped as text; ``python -m shoal`` started warm (tests/warm.py)."""
    env = {k: v for k, v in (os.environ if env is None else env).items() if k != "SHOAL_ENV"}
    return warm.popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
        **kwargs,
    )


def wait_for(
    predicate, timeout: float = 120.0, interval: float = 0.02, what: str = "condition", *, unless=None, details=None
) -> None:
    """Poll ``predicate`` until it is true. ``TimeoutError`` naming ``what`` after ``timeout`` s, or
    at once when ``unless()`` turns true first (say, the process that was to get there ended);
    ``details()``, if given, is appended to the error (a log, the output so far)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        gave_up = unless is not None and unless()
        if gave_up or time.monotonic() > deadline:
            why = "given up" if gave_up else f"not reached within {timeout:g} s"
            raise TimeoutError(f"{what}: {why}" + (f"\n{details()}" if details else ""))
        time.sleep(interval)


def checkpoints(directory: Path) -> list[Path]:
    return sorted(directory.glob("ckpt-*.pt")) if directory.is_dir() else []


def children(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                found.append(int(entry.name))
    return found


def workers(pid: int) -> list[int]:
    """The worker processes of a ``shoal train --nproc`` launcher: spawned (``spawn_main`` in their
    command line) or forked (the launcher's own command line)."""
    try:
        launcher = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    out = []
    for child in children(pid):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline or cmdline == launcher:
            out.append(child)
    return sorted(out)


def alive(pid: int) -> bool:
    """True if ``pid`` runs (a zombie waiting for its reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def process_tree(pid: int) -> list[str]:
    """One line per process from ``pid`` down: pid, state, kernel wait channel, thread names, command."""
    lines, todo = [], [(pid, 0)]
    while todo:
        current, depth = todo.pop()
        base = Path(f"/proc/{current}")
        try:
            state = (base / "stat").read_text().rsplit(")", 1)[1].split()[0]
            wchan = (base / "wchan").read_text() or "-"
            threads = sorted({(task / "comm").read_text().strip() for task in (base / "task").iterdir()})
            cmd = (base / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        lines.append(f"{'  ' * depth}{current} {state} {wchan} [{', '.join(threads)}] {cmd[:160]}")
        todo += [(child, depth + 1) for child in sorted(children(current), reverse=True)]
    return lines


def diagnose_stuck(proc: subprocess.Popen, wait_s: float = 10.0) -> str:
    """What a launcher that does not exit is doing, then gone with its process group.

    The process tree (states, wait channels, threads), then SIGABRT: started with
    ``PYTHONFAULTHANDLER=1``, it prints every thread's Python stack to its stderr, which this returns
    with the tree (read from ``proc``'s stderr pipe, if it has one)."""
    tree = process_tree(proc.pid)
    proc.send_signal(signal.SIGABRT)
    try:
        _, err = proc.communicate(timeout=wait_s)
    except subprocess.TimeoutExpired as timeout:
        err = timeout.stderr
    finally:
        kill_group(proc)  # the launcher's session (start_new_session=True), workers and all
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    if isinstance(err, bytes):
        err = err.decode(errors="replace")
    return "process tree:\n" + "\n".join(tree) + "\nstderr after SIGABRT:\n" + (err or "")


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def stop_all(procs: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM to those of ``procs`` still running, SIGKILL to any still there after ``grace_s``."""
    stop_with_grace(
        procs, running=lambda p: p.poll() is None, ask=subprocess.Popen.terminate, kill=subprocess.Popen.kill,
        grace_s=grace_s,
    )  # fmt: skip
