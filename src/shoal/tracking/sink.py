"""One backend on its own thread: the training loop never waits for a tracker, and a tracker that
fails is reported once and switched off.

Calls are queued in order and run by a daemon thread; the first exception (from ``open`` or any
later call) disables the backend with one line naming it and the error, and what is still queued
is dropped. A backend that cannot keep up (``max_pending`` calls waiting, e.g. a server that
stopped answering) is disabled the same way. ``close`` waits a bounded time, then gives up on
the thread: a daemon thread never keeps the process alive.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from shoal.errors import first_line
from shoal.tracking.backend import Backend

_STOP = object()


class Sink:
    def __init__(self, backend: Backend, say: Callable[[str], None], *, max_pending: int = 10_000) -> None:
        self.backend = backend
        self.name = backend.name
        self._say = say
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self._thread: threading.Thread | None = None
        self._opened = threading.Event()  # set once open() has returned or failed
        self.failed = False
        self._closing = False

    # -- caller's thread ----------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=f"shoal-tracker-{self.name}", daemon=True)
        self._thread.start()
        self.submit(self._open)

    def submit(self, method: Callable[..., Any] | None, *args: Any) -> None:
        """Queue ``method(*args)`` for the backend's thread (dropped once the backend is off).
        ``None`` with one Event is a marker: the thread sets the event when it gets there."""
        if self._closing or (self.failed and method is not None):
            return
        try:
            self._queue.put_nowait((method, args))
        except queue.Full:
            self._fail(f"it is not keeping up ({self._queue.maxsize} calls waiting)")

    def wait_open(self, timeout: float) -> bool:
        return self._opened.wait(timeout)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until everything queued so far has run (or the backend is off). False on timeout."""
        if self._thread is None or self.failed:
            return True
        done = threading.Event()
        self.submit(None, done)  # a marker: runs even after a failure, so nobody waits in vain
        return done.wait(timeout) or self.failed

    def close(self, failed: bool) -> None:
        """Queue the backend's close (its run ends, marked failed if ``failed``) and the thread's end."""
        if self._thread is None or self._closing:
            return
        self._closing = True  # nothing else gets queued
        for item in ((self.backend.close, (failed,)), _STOP):
            while True:
                try:
                    self._queue.put_nowait(item)
                    break
                except queue.Full:  # too far behind: it is off now, and its oldest call goes
                    self._fail(f"it is not keeping up ({self._queue.maxsize} calls waiting)")
                    try:
                        self._queue.get_nowait()
                    except queue.Empty:
                        pass

    def join(self, deadline: float) -> bool:
        """Wait until the thread has ended, or ``deadline`` (monotonic); False if it still runs
        (it is left behind: a daemon thread never keeps the process alive)."""
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        return self._thread is None or not self._thread.is_alive()

    # -- the backend's thread -----------------------------------------------------------------

    def _open(self) -> None:
        try:
            self.backend.open()
        finally:
            self._opened.set()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            method, args = item
            if method is None:
                args[0].set()
                continue
            if self.failed:
                if method == self.backend.close:  # still try to end its run, marked failed; quietly
                    try:
                        method(True)
                    except BaseException:
                        pass
                continue
            try:
                method(*args)
            except BaseException as err:  # a tracker must never take the job down
                self._fail(f"{type(err).__name__}: {first_line(err)}")

    def _fail(self, why: str) -> None:
        if not self.failed:
            self.failed = True
            self._say(f"failed and is now off ({why}); training goes on")
