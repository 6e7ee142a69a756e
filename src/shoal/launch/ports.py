"""TCP ports for rendezvous: pick a free one, or check that a chosen one is not taken.

Both functions only touch sockets on this machine and return within milliseconds, so a launcher can
call them before it spends seconds starting workers.
"""

from __future__ import annotations

import errno
import socket

from shoal.errors import ShoalError


def find_free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that nothing listens on right now (the OS picks it).

    The socket is closed before returning, so another process could take the port before the caller
    binds it. Where that window matters, prefer letting the server bind port 0 itself (what
    ``shoal run`` does for single-node jobs, via torch's c10d rendezvous on ``127.0.0.1:0``).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def check_port_free(port: int, host: str = "0.0.0.0", *, hint: str | None = None) -> None:
    """Raise :class:`ShoalError` if ``port`` on ``host`` cannot be bound (something listens there).

    Binds with ``SO_REUSEADDR``, as torch's TCPStore does, so a port that only has connections in
    TIME_WAIT from a previous run counts as free: the store would bind it fine. A port held by a
    listening socket on any overlapping address (e.g. another job's store on 127.0.0.1 when
    ``host`` is 0.0.0.0) counts as taken.

    Args:
        port: the TCP port (1-65535).
        host: the address the server will bind; 0.0.0.0 (every interface) catches the most clashes.
        hint: replaces the default hint ("pick another --master-port, or omit it ...") where that
            advice does not fit, e.g. on a multi-node job every node must be given the same port.
    """
    if not 0 < port < 65536:
        raise ShoalError(
            f"port {port} is not a valid TCP port",
            "pick a port between 1024 and 65535, or omit --master-port to get a free one",
        )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise ShoalError(
                    f"port {port} is already in use on this machine",
                    hint or "pick another --master-port, or omit it to get a free one",
                ) from None
            if err.errno == errno.EACCES:
                raise ShoalError(
                    f"port {port} needs privileges to bind on this machine",
                    "pick a port above 1023, or omit --master-port to get a free one",
                ) from None
            raise ShoalError(
                f"cannot bind port {port} on {host}: {err.strerror}",
                hint or "pick another --master-port, or omit it to get a free one",
            ) from None
