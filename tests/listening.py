"""The TCP sockets a job listens on, read from /proc: the job's processes' socket inodes matched
against the listening entries of /proc/<pid>/net/tcp and tcp6 (each process's own network
namespace)."""

from __future__ import annotations

import ipaddress
import socket
import struct
from pathlib import Path

from procs import children

_LISTEN = "0A"


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    out, todo = [pid], [pid]
    while todo:
        for child in children(todo.pop()):
            out.append(child)
            todo.append(child)
    return out


def listening(pids: list[int]) -> set[tuple[str, int, int]]:
    """(address, port, pid) of every TCP socket in LISTEN state that one of ``pids`` holds."""
    found = set()
    for pid in pids:
        inodes = set()
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = fd.readlink().name if fd.is_symlink() else ""
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:  # the process ended meanwhile
            continue
        for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
            try:
                lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                fields = line.split()
                if fields[3] == _LISTEN and fields[9] in inodes:
                    address, port = fields[1].split(":")
                    found.add((_address(address, family), int(port, 16), pid))
    return found


def _address(hex_address: str, family: int) -> str:
    raw = bytes.fromhex(hex_address)
    if family == socket.AF_INET:
        return socket.inet_ntop(family, struct.pack("<I", int.from_bytes(raw, "big")))
    words = struct.unpack(">4I", raw)
    return socket.inet_ntop(family, struct.pack("<4I", *words))


def is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback
