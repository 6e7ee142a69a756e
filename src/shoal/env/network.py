"""Which local interface and address reach the master: the choice torchrun leaves to luck.

On many clusters a machine's hostname resolves to 127.0.0.1 (or 127.0.1.1). torch then advertises
that loopback address to the other nodes in two places: gloo's full mesh (each rank publishes the
address of the interface it bound, found from the hostname unless ``GLOO_SOCKET_IFNAME`` names one)
and the c10d rendezvous (each agent publishes ``--local-addr``, else ``socket.getfqdn()``). The
other nodes then connect to their own loopback and the job fails after minutes (see
``../shared/ENVIRONMENT.md``). NCCL has the same problem with ``NCCL_SOCKET_IFNAME``.

The right answer is whatever the kernel would use to reach the master: :func:`route_to` asks it
with the UDP ``connect()`` trick (a datagram socket "connected" to the master: the kernel picks the
route and the source address, and nothing is sent), then finds which interface holds that address.
When the master is this very machine the source address is the master's own address, which sits on
the interface the other nodes reach it through, so the same rule holds on every node.

Everything here only reads local state (sockets, ioctl, /proc); nothing talks to the network.
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import os
import socket
import struct
import subprocess
from dataclasses import dataclass

from shoal.errors import ShoalError

_SIOCGIFADDR = 0x8915  # Linux: an interface's (primary) IPv4 address
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


@dataclass(frozen=True)
class Route:
    """How this node reaches the master, and what it should advertise to the other nodes."""

    master: str
    """The master as given (host name or address)."""
    master_ip: str
    """The address it resolves to here."""
    addr: str
    """This node's address on the way to the master: what the other nodes can connect to."""
    ifname: str | None
    """The interface holding ``addr`` (None if it could not be found)."""
    why: str
    """Why these were chosen, for the start-up line."""
    master_is_local: bool
    """The master address belongs to this machine (this node hosts the rendezvous)."""
    loopback: bool
    """The master is a loopback address: every node must run on this machine."""


class UnresolvedHost(ShoalError):
    """A host name that does not resolve here (yet: a pod's Service name resolves once it runs)."""


def resolve(host: str) -> list[str]:
    """The addresses ``host`` resolves to here, IPv4 first; :class:`UnresolvedHost` if it does not."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror as err:
        raise UnresolvedHost(
            f"cannot resolve the master address {host!r} on this node: {err.strerror}",
            "give the master node's IP address (e.g. --master-addr 10.0.0.1), or a name that "
            "resolves on every node (check /etc/hosts and DNS)",
        ) from None
    addrs: list[str] = []
    for family in (socket.AF_INET, socket.AF_INET6):
        for info in infos:
            addr = str(info[4][0]).split("%", 1)[0]
            if info[0] == family and addr not in addrs:
                addrs.append(addr)
    return addrs


def is_loopback(host: str) -> bool:
    """True if ``host`` is a loopback address (127.0.0.0/8, ::1) or a loopback name (localhost)."""
    host = host.strip("[]")
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bracket(address: str) -> str:
    """``address`` ready to be followed by ``:PORT``: IPv6 literals in brackets, the rest as is."""
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def is_local_address(addr: str) -> bool:
    """True if ``addr`` is an address of this machine (it can be bound here)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        try:
            sock.bind((addr, 0))
        except OSError:
            return False
    return True


def source_address(target_ip: str) -> str:
    """The local address the kernel would send from to reach ``target_ip`` (no packet is sent).

    Raises OSError (e.g. ENETUNREACH) when there is no route.
    """
    family = socket.AF_INET6 if ":" in target_ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect((target_ip, 9))  # port 9 (discard); connect() on UDP only picks a route
        return str(sock.getsockname()[0]).split("%", 1)[0]


def interface_addresses() -> dict[str, list[str]]:
    """``{interface: [addresses]}`` for this machine (IPv4 primary addresses and IPv6)."""
    found: dict[str, list[str]] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address (or not up)
                continue
            found.setdefault(name, []).append(socket.inet_ntoa(packed[20:24]))
    try:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 6:
                    raw = bytes.fromhex(fields[0])
                    found.setdefault(fields[5], []).append(socket.inet_ntop(socket.AF_INET6, raw))
    except OSError:
        pass
    return found


def interface_of(addr: str) -> str | None:
    """The interface holding ``addr``, or None."""
    for name, addrs in interface_addresses().items():
        if addr in addrs:
            return name
    return _interface_from_ip_command(addr)  # secondary IPv4 addresses are invisible to the ioctl


def _interface_from_ip_command(addr: str) -> str | None:
    try:
        out = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():  # "3: eth0    inet 10.0.0.2/24 brd ... scope global eth0:1"
        fields = line.split()
        if len(fields) >= 4 and fields[3].split("/", 1)[0] == addr:
            return fields[1].split("@", 1)[0]
    return None


def default_route_interface() -> str | None:
    """The interface of the IPv4 default route (from /proc/net/route), or None."""
    try:
        with open("/proc/net/route") as f:
            next(f, None)
            for line in f:
                fields = line.split()
                if len(fields) >= 8 and fields[1] == "00000000" and fields[7] == "00000000":
                    return fields[0]
    except OSError:
        pass
    return None


def _own_routable_address() -> tuple[str, str] | None:
    """(interface, IPv4 address) other machines can most likely reach this one on.

    The default route's interface; else the only interface with a non-loopback IPv4 address.
    """
    addrs = {
        name: [a for a in found if ":" not in a and not is_loopback(a)] for name, found in interface_addresses().items()
    }
    addrs = {name: found for name, found in addrs.items() if found}
    default = default_route_interface()
    if default in addrs:
        return default, addrs[default][0]
    if len(addrs) == 1:
        name, found = next(iter(addrs.items()))
        return name, found[0]
    return None


def route_to(master: str) -> Route:
    """Pick this node's interface and address for a job whose master is ``master``.

    Raises:
        ShoalError: ``master`` does not resolve, or no route leads to it from here.
    """
    ips = resolve(master)
    master_ip = ips[0]
    name = master.strip("[]").lower()
    if is_loopback(master_ip):
        if is_loopback(name):
            return Route(
                master,
                master_ip,
                master_ip,
                "lo" if os.path.exists("/sys/class/net/lo") else None,
                f"the master {master} is a loopback address: every node runs on this machine",
                master_is_local=True,
                loopback=True,
            )
        # A host name that resolves to loopback *here*: it is this machine's own name mapped to
        # 127.x in /etc/hosts. This node is the master; advertise its real address instead.
        own = _own_routable_address()
        if own is None:
            return Route(
                master,
                master_ip,
                master_ip,
                None,
                f"{master} resolves to {master_ip} here and no single outward interface was found",
                master_is_local=True,
                loopback=True,
            )
        ifname, addr = own
        return Route(
            master,
            master_ip,
            addr,
            ifname,
            f"{master} resolves to {master_ip} here (this machine's own name), so the "
            f"address of the {'default route' if ifname == default_route_interface() else 'only'} "
            "interface is used",
            master_is_local=True,
            loopback=False,
        )
    last_err: OSError | None = None
    for ip in ips:
        try:
            addr = source_address(ip)
        except OSError as err:
            last_err = err
            continue
        local = is_local_address(ip)
        ifname = interface_of(addr)
        if local:
            why = f"the master {ip} is this node's own address"
        else:
            why = f"the interface that routes to the master {ip}"
        return Route(master, ip, addr, ifname, why, master_is_local=local, loopback=False)
    reason = os.strerror(last_err.errno) if last_err and last_err.errno else str(last_err)
    raise ShoalError(
        f"no route from this node to the master {master} ({master_ip}): {reason}",
        "check --master-addr / --rdzv-endpoint: it must be the master node's address on a network "
        f"this node is connected to (`ip route get {master_ip}` shows the route)",
    )


def probe_tcp(host: str, port: int, timeout: float = 1.0) -> str:
    """Try one TCP connection to ``host:port``; return ``"open"``, ``"refused"``, ``"timeout"``,
    ``"unreachable"`` or an error description. Used only to explain a failure after the fact."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return "open"
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "timeout"
    except OSError as err:
        if err.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return "unreachable"
        return err.strerror or str(err)
