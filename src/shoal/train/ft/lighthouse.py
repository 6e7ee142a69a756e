"""torchft's lighthouse, started and kept alive by the launcher of a fault-tolerant job.

The lighthouse (torchft's Rust quorum server, run by :mod:`shoal.train.ft.lighthouse_main`) decides each step which
replica groups train together. shoal runs it as a child process bound to the address it chose
(loopback on one node; never torchft's default ``[::]``), with

* a short heartbeat timeout (:func:`shoal.env.replica.heartbeat_ms`): a group that died is out of the next
  quorum after about a second instead of torchft's 5 s, up to 256 groups (10 s above);
* a restart when it dies: the groups' quorum calls fail meanwhile, and the workers retry them
  (``TORCHFT_QUORUM_RETRIES``, :data:`QUORUM_RETRIES`), which torchft does not by default: a
  lighthouse that came back would otherwise leave every group to die at the quorum timeout.

Nothing here imports torch or torchft: the lighthouse is its own process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from shoal.console import write_line
from shoal.env.replica import lighthouse_args
from shoal.errors import ShoalError
from shoal.launch.ports import find_free_port
from shoal.launch.process import PR_SET_PDEATHSIG
from shoal.stopping import stop_with_grace

QUORUM_RETRIES = 10
"""Each worker's retries of a failed quorum call (torchft's default: 0). torchft waits the quorum
timeout / (retries + 1) between two tries (torchft/src/manager.rs, ``_quorum_with_retries``,
0.2.0): 2.7 s here. Shorter waits (60 retries: 0.5 s) bring the groups back sooner, but then the
first group to retry often meets a restarted lighthouse that has not yet heard the others'
heartbeats, and trains alone: 4 of 12 lighthouse kills then cost 10 s instead of 2.8 s
(tests/train/ft/bench_ft.py --lighthouse-kills)."""
_CHECK_S = 0.2
_INSTALL_HINT = "pip install 'shoal[ft]' (torchft, PyTorch's per-step fault tolerance)"


class Lighthouse:
    """A supervised ``torchft_lighthouse`` on ``host``; use as a context manager.

    :attr:`url` is what the workers' managers connect to (``TORCHFT_LIGHTHOUSE``). A lighthouse that
    exits while the job runs is started again on the same port, and the restart is said in one line.
    """

    def __init__(
        self, host: str = "127.0.0.1", port: int | None = None, *, min_replicas: int = 1, groups: int | None = None
    ) -> None:
        self.host = host
        self.port = port if port is not None else find_free_port(host)
        self.min_replicas = min_replicas
        self.groups = groups
        """The job's replica groups, if known: they set the heartbeat timeout."""
        self.restarts = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._stop = threading.Event()
        self._watch: threading.Thread | None = None

    @property
    def bind(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.bind}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def command(self) -> list[str]:
        return [
            sys.executable,
            str(Path(__file__).with_name("lighthouse_main.py")),
            *lighthouse_args(self.bind, self.min_replicas, self.groups),
        ]

    def __enter__(self) -> Lighthouse:
        self._start()
        self._watch = threading.Thread(target=self._supervise, name="shoal-lighthouse", daemon=True)
        self._watch.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.join()
        if self._process is not None:
            stop_with_grace(
                [self._process], running=lambda p: p.poll() is None, ask=subprocess.Popen.terminate,
                kill=subprocess.Popen.kill, grace_s=5.0,
            )  # fmt: skip

    def _start(self) -> None:
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        try:
            # Dies with the thread that started it (PR_SET_PDEATHSIG): a launcher killed outright
            # leaves no lighthouse behind.
            self._process = subprocess.Popen(
                self.command(), env=env, stdin=subprocess.DEVNULL, preexec_fn=_die_with_starter
            )
        except OSError as err:
            raise ShoalError(f"cannot start torchft's lighthouse: {err}", _INSTALL_HINT) from None

    def _supervise(self) -> None:
        while not self._stop.wait(_CHECK_S):
            process = self._process
            if process is None or process.poll() is None:
                continue
            self.restarts += 1
            write_line(
                f"shoal: torchft's lighthouse on {self.bind} exited ({process.returncode}); "
                f"starting it again (restart {self.restarts})"
            )
            time.sleep(_CHECK_S)  # the port is free again once the process is reaped
            self._start()


def _die_with_starter() -> None:
    """In the lighthouse's process, before exec: SIGKILL when the launcher's starting thread ends."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
