"""Where each worker's stderr goes, and telling the launcher when a (re)start happens.

The agent calls its ``LogsSpecs.reify`` right before it starts (or restarts) the workers, with every
worker's environment (which it may still change, as torch's ``DefaultLogsSpecs`` does to name each
error file), so the rendezvous address and the ranks are known there: the launch core prints its
start line from :class:`RecordingLogsSpecs`. Wrapping rather than subclassing keeps a user's
``--logs-specs`` plugin working.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterable
from typing import Any


def recording_logs_specs(inner: Any, *, tee: bool, on_start: Callable[[dict[str, str], dict[int, str]], None]) -> Any:
    """Wrap a launch's LogsSpecs: place each worker's stderr log and announce each start.

    ``on_start(env, failed)``: local rank 0's environment, and the error files the previous attempt's
    workers wrote (global rank -> path; empty at the first start), whose tracebacks a restart shows.

    ``tee``: the workers run in :mod:`shoal.launch.worker_shim`, which copies stderr to
    ``$SHOAL_STDERR_LOG`` where that is set (not when torch already writes the worker's stderr to a
    file: ``--redirects``/``--tee``, nor without a log dir: ``--log-dir /dev/null``). The paths of
    the current attempt are in ``.stderrs`` (local rank -> path).
    """
    from torch.distributed.elastic.multiprocessing.api import LogsSpecs

    class RecordingLogsSpecs(LogsSpecs):
        def __init__(self) -> None:
            super().__init__(log_dir=inner.root_log_dir)
            self.stderrs: dict[int, str] = {}
            self.error_files: dict[int, str] = {}  # global rank -> this attempt's error file

        @property
        def root_log_dir(self) -> str:
            return inner.root_log_dir

        def reify(self, envs: dict[int, dict[str, str]]) -> Any:
            dest = inner.reify(envs)
            failed = {rank: path for rank, path in self.error_files.items() if os.path.isfile(path)}
            self.error_files = {
                int(env.get("RANK", local)): dest.error_files[local]
                for local, env in envs.items()
                if dest.error_files.get(local)
            }
            self.stderrs = {}
            for rank, env in envs.items():
                redirected = dest.stderrs.get(rank)
                error_file = dest.error_files.get(rank)
                if redirected and redirected != os.devnull:  # torch writes it (--redirects/--tee)
                    self.stderrs[rank] = redirected
                elif tee and error_file and error_file != os.devnull:
                    path = os.path.join(os.path.dirname(error_file), "stderr.log")
                    env["SHOAL_STDERR_LOG"] = self.stderrs[rank] = path
            if envs:
                on_start(envs[min(envs)], failed)
            return dest

    return RecordingLogsSpecs()


def wait_for_tees(paths: Iterable[str], timeout: float = 3.0) -> None:
    """Wait (at most ``timeout`` s) until every worker's stderr tee is done: it holds an flock."""
    deadline = time.monotonic() + timeout
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.02)
        finally:
            os.close(fd)
