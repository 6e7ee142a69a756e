"""find_free_port and check_port_free against real sockets on loopback."""

from __future__ import annotations

import socket

import pytest

from shoal.errors import ShoalError
from shoal.launch.ports import check_port_free, find_free_port


def test_find_free_port_is_bindable():
    port = find_free_port()
    assert 0 < port < 65536
    check_port_free(port, host="127.0.0.1")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_taken_port_is_a_one_line_error_with_hint():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # A store bound to 127.0.0.1 also blocks one that would bind every interface.
        for host in ("127.0.0.1", "0.0.0.0"):
            with pytest.raises(ShoalError) as info:
                check_port_free(port, host=host)
            err = info.value
            assert str(port) in err.message and "in use" in err.message
            assert "\n" not in err.message
            assert "--master-port" in err.hint and "omit" in err.hint


def test_custom_hint_replaces_default():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(ShoalError) as info:
            check_port_free(busy.getsockname()[1], hint="give every node the same port")
    assert info.value.hint == "give every node the same port"


def test_port_with_only_time_wait_connections_counts_as_free():
    # The TCPStore binds with SO_REUSEADDR, so leftovers of a previous run must not block it.
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = server.accept()
        conn.close()  # the server side closes first: its end goes to TIME_WAIT
        client.close()
    check_port_free(port)


@pytest.mark.parametrize("port", [0, -1, 65536])
def test_invalid_port(port):
    with pytest.raises(ShoalError, match="not a valid TCP port"):
        check_port_free(port)
