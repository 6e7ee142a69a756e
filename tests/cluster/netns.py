"""Two "nodes" on one machine: two network namespaces joined by a veth pair.

Each node is a network namespace with its own loopback and one end of a veth pair, addressed in a
private /24 (10.77.N.1 and 10.77.N.2). Processes run in a node through ``ip netns exec``: they see
only that node's interfaces, so a launcher there must find the veth by itself, exactly as on two
real machines. The machine's hostname resolves to 127.0.0.1 in every namespace (as on many real
clusters), which is the trap the launchers must not fall into.

Usage (needs root and iproute2)::

    from cluster.netns import netns_unavailable, node_pair

    with node_pair() as (a, b):
        a.popen(["python", "-c", "..."])          # runs in namespace a.name
        b.run(["ping", "-c1", a.addr], check=True)

Every name carries the creating process's PID, so concurrent test sessions never collide; the
namespaces (and with them the veth pair) are deleted on exit, and so are any processes still running
in them that were started through :meth:`Node.popen`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import warm
from procs import stop_all, wait_for

SUBNET_PREFIX = "10.77"
"""Private addresses used inside the namespaces only: 10.77.<subnet>.1 and 10.77.<subnet>.2."""


@dataclass
class Node:
    """One network namespace standing in for a machine."""

    name: str
    """The namespace's name (``ip netns exec NAME ...``)."""
    addr: str
    """Its address on the link to the other node."""
    ifname: str
    """The name of its end of the veth pair (inside the namespace)."""
    _procs: list[subprocess.Popen] = field(default_factory=list, repr=False)
    _parked: subprocess.Popen | None = field(default=None, repr=False)

    def cmd(self, cmd: Sequence[str]) -> list[str]:
        """``cmd`` wrapped to run inside this namespace."""
        return ["ip", "netns", "exec", self.name, *cmd]

    def popen(self, cmd: Sequence[str], **kw: Any) -> subprocess.Popen:
        """``subprocess.Popen`` inside this namespace (stopped at teardown if still running).
        ``python -m shoal`` starts warm (tests/warm.py) in the namespaces of a process that ``ip netns
        exec`` set up here (:meth:`parked_pid`), in the caller's directory, as ``ip netns exec`` leaves it."""
        warm_kw = {**kw, "cwd": kw.get("cwd") or os.getcwd()}
        proc = warm.start(list(cmd), enter=self.parked_pid, **warm_kw) or subprocess.Popen(self.cmd(cmd), **kw)
        self._procs.append(proc)
        return proc

    def parked_pid(self) -> int:
        """A process left in this node as ``ip netns exec`` sets one up (the node's network namespace,
        a mount namespace of its own with the node's /sys): started on first use, stopped with the rest."""
        if self._parked is None or self._parked.poll() is not None:
            self._parked = subprocess.Popen(self.cmd(["sleep", "infinity"]))
            self._procs.append(self._parked)
            pid = self._parked.pid  # ip netns exec execs the command once the namespaces are in place
            wait_for(lambda: os.path.realpath(f"/proc/{pid}/exe").endswith("/sleep"), timeout=30)
        return self._parked.pid

    def pids(self) -> list[int]:
        """The processes in this node's network namespace, but for the parked one (:meth:`parked_pid`)."""
        parked = self._parked.pid if self._parked is not None else None
        return [pid for pid in self._all_pids() if pid != parked]

    def _all_pids(self) -> list[int]:
        listed = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True).stdout
        return [int(pid) for pid in listed.split()]

    def run(self, cmd: Sequence[str], **kw: Any) -> subprocess.CompletedProcess:
        """``subprocess.run`` inside this namespace."""
        return subprocess.run(self.cmd(cmd), **kw)

    def stop_processes(self) -> None:
        """Stop what :meth:`popen` started here and still runs (SIGTERM, then SIGKILL)."""
        stop_all(self._procs, 10)
        self._procs.clear()
        # Anything else still running in the namespace (orphaned workers): only this node's.
        for pid in self._all_pids():
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def netns_unavailable() -> str | None:
    """Why two namespaced nodes cannot be made here, or None if they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    probe = f"shoalprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip() or made.returncode}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


@contextmanager
def node_pair(tag: str | None = None, subnet: int = 0) -> Iterator[tuple[Node, Node]]:
    """Create two namespaced nodes linked by a veth pair; delete both on exit.

    Args:
        tag: makes the names unique (default: this process's PID); at most 8 characters, since an
            interface name has at most 15.
        subnet: the third byte of the addresses (10.77.<subnet>.1/.2).
    """
    tag = tag or str(os.getpid())
    names = (f"shoal{tag}a", f"shoal{tag}b")
    ifnames = (f"vsh{tag}a", f"vsh{tag}b")
    addrs = (f"{SUBNET_PREFIX}.{subnet}.1", f"{SUBNET_PREFIX}.{subnet}.2")
    nodes = tuple(Node(n, a, i) for n, a, i in zip(names, addrs, ifnames))
    created: list[str] = []
    try:
        for name in names:
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)  # a stale one
            _ip("netns", "add", name)
            created.append(name)
        _ip("link", "add", ifnames[0], "type", "veth", "peer", "name", ifnames[1])
        for node in nodes:
            _ip("link", "set", node.ifname, "netns", node.name)
            _ip("-n", node.name, "addr", "add", f"{node.addr}/24", "dev", node.ifname)
            _ip("-n", node.name, "link", "set", node.ifname, "up")
            _ip("-n", node.name, "link", "set", "lo", "up")
        yield nodes  # type: ignore[misc]
    finally:
        for node in nodes:
            node.stop_processes()
        for name in created:  # deleting a namespace destroys the veth end inside it, and its peer
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
