"""Test runs that mostly wait (on a hang timeout, a rendezvous), started beside each other.

A test file makes one :class:`Background`, marks each such test with its run (``@runs.of(fn)``),
and defines a module fixture that yields :meth:`Background.started` and a ``scenario`` fixture that
hands each test its own run (:meth:`Background.scenario`). Only the runs of the tests selected in
the session start (under xdist a file's tests share one worker: tests/conftest.py's groups), at most
``at_once`` at a time, each ``run(directory)`` in a thread; the test checks what it returned with
``scenario.result()``, which raises what the run raised (a skip or a failed assertion included).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest


class Background:
    def __init__(self, at_once: int) -> None:
        self.at_once = at_once
        self._runs: list[tuple[str, Callable[[Path], object]]] = []

    def of(self, run: Callable[[Path], object], *, first: bool = False):
        """Decorator: the test's run, started before the others' with ``first`` (the longest wait)."""

        def register(test):
            self._runs.insert(0 if first else len(self._runs), (test.__name__, run))
            return test

        return register

    @contextmanager
    def started(self, request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[dict[str, Future]]:
        """The selected tests' runs, by test name; at exit those not started are dropped and the
        others waited for."""
        selected = {item.originalname for item in request.session.items if item.path == request.path}
        pool = ThreadPoolExecutor(self.at_once, thread_name_prefix="background")
        try:
            yield {
                name: pool.submit(run, tmp_path_factory.mktemp(name.removeprefix("test_")[:40]))
                for name, run in self._runs
                if name in selected
            }
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    @staticmethod
    def scenario(request: pytest.FixtureRequest, started: dict[str, Future]) -> Future:
        """The requesting test's run."""
        return started[request.node.originalname]
