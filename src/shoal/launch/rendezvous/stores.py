"""TCP stores that listen on one address, and waiting for a store to come up.

torch's ``TCPStore`` server binds every interface (``*:PORT``) and has no authentication: anyone who
can reach the port can read and write the job's keys. It also accepts an already-listening socket
(``master_listen_fd``, with its default libuv server; checked with torch 2.15), which is how shoal
binds each store to the address the rendezvous plan chose: 127.0.0.1 on one node, the interface
that leads to the other nodes across several.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from shoal.env.network import probe_tcp

LISTEN_BACKLOG = 2048
_T = TypeVar("_T")


class StoreUnreachable(Exception):
    """The rendezvous store did not accept a connection before the deadline."""

    def __init__(self, host: str, port: int, status: str) -> None:
        super().__init__(f"{host}:{port}: {status}")
        self.status = status
        """What the last attempt got: ``refused``, ``timeout``, ``unreachable``, or an error."""


def listening_socket(addr: str, port: int) -> socket.socket:
    """A TCP socket listening on ``addr:port`` (port 0: the OS picks). OSError if it cannot bind."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # As TCPStore does: a port whose last connections linger in TIME_WAIT can be bound again.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr, port))
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def serve_store(addr: str, port: int, *, timeout: float, world_size: int | None = None, wait: bool = False) -> Any:
    """A ``TCPStore`` server listening on ``addr:port`` only; its ``.port`` is the bound port.

    ``world_size`` and ``wait``: the server waits in the constructor until that many clients
    (itself included) have connected, as torch's static rendezvous counts arriving nodes.
    Raises OSError (EADDRINUSE, EADDRNOTAVAIL) when the address cannot be bound.
    """
    import torch.distributed as dist

    sock = listening_socket(addr, port)
    # The store takes the descriptor over (it closes it when destroyed): detach it from Python's
    # socket object, or the object's finaliser would close it under the store.
    fd = sock.detach()
    return dist.TCPStore(
        addr,
        port if port else _bound_port(fd),
        world_size,
        True,
        timedelta(seconds=timeout),
        wait_for_workers=wait,
        multi_tenant=True,
        master_listen_fd=fd,
        use_libuv=True,
    )


def connect_store(host: str, port: int, *, timeout: float, world_size: int | None = None, wait: bool = False) -> Any:
    """A ``TCPStore`` client of ``host:port`` (``world_size``/``wait``: as torch's static rendezvous)."""
    import torch.distributed as dist

    return dist.TCPStore(host, port, world_size, False, timedelta(seconds=timeout), wait_for_workers=wait)


def serve_or_connect(addr: str, host: str, port: int, *, timeout: float) -> tuple[Any, bool]:
    """Serve the store on ``addr:port``; if another process here already does, connect to it.

    For nodes that share one machine (a loopback endpoint): the first to bind hosts the store, as
    torch's c10d backend does when it cannot tell which node should. Returns (store, served).
    """
    try:
        return serve_store(addr, port, timeout=timeout), True
    except OSError as err:
        if err.errno != errno.EADDRINUSE:
            raise
    return connect_store(host, port, timeout=timeout), False


def wait_for_store(host: str, port: int, deadline: float) -> None:
    """Wait until ``host:port`` accepts connections; :class:`StoreUnreachable` at ``deadline``.

    ``deadline`` is a ``time.monotonic()`` of this process. A bare connection is harmless to the
    store: it only ever answers requests.
    """
    status = "timeout"
    while (remaining := deadline - time.monotonic()) > 0:
        status = probe_tcp(host, port, timeout=min(1.0, remaining))
        if status == "open":
            return
        time.sleep(max(0.0, min(0.5, deadline - time.monotonic())))
    raise StoreUnreachable(host, port, status)


class StoreSilent(Exception):
    """A store request got no answer in time: its host vanished (powered off, cut off, or stopped)."""


def answer_within(call: Callable[[], _T], timeout: float) -> _T:
    """``call()`` (store requests) run in a helper thread and waited for at most ``timeout`` s.

    Why: a ``TCPStore`` request to a host that vanished without closing the connection (a machine
    cut off or powered off, a stopped process) blocks in C++ until TCP gives up, minutes to a
    quarter of an hour, whatever the store's own timeout (seen with torch 2.15: ``check`` with a
    2 s timeout still waiting after 120 s). And a main thread blocked in C++ runs no Python signal
    handler: the launcher's SIGTERM waited as long. Here the main thread waits on a lock, which a
    signal interrupts, so SIGTERM is handled at once, and the wait ends at ``timeout`` with
    :class:`StoreSilent`; the helper thread (a daemon) is left to TCP and never delays the exit.
    Exceptions of ``call`` are raised here. (Residual risk: should the silent host reset the
    connection in the very milliseconds this process finalises, the helper's C++ error can abort
    the exit, seen once in a test that killed the server as its process ended.)
    """
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as err:  # handed to the caller
            outcome.append((False, err))

    helper = threading.Thread(target=run, name="shoal-store-request", daemon=True)
    helper.start()
    helper.join(timeout)
    if not outcome:
        raise StoreSilent(f"no answer in {timeout:g} s")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def _bound_port(fd: int) -> int:
    with socket.socket(fileno=socket.dup(fd)) as view:
        return int(view.getsockname()[1])
