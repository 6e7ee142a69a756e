"""Pods on one machine: network namespaces on a bridge, each with its own names, host name and mounts.

Each pod is a network namespace with one interface, ``eth0``, whose peer sits in a *switch*
namespace holding a bridge: the pods reach each other on a private /24 (``10.77.<subnet>.2`` and up)
and the host's own network is untouched. Every pod also gets

- its own name resolution: ``/etc/netns/<ns>/hosts`` (which ``ip netns exec`` binds over
  ``/etc/hosts``) maps the names the pod resolves (:attr:`PodSpec.resolves`) to the pods' addresses,
  and a ``resolv.conf`` whose name server answers nothing, so an unknown name fails at once;
- its own host name, in a UTS namespace (``hostname`` prints :attr:`PodSpec.hostname`);
- its own mounts, in a mount namespace: a private ``/run`` (a tmpfs, with ``/run/sshd``), and the
  :attr:`PodSpec.mounts` (bind mounts of host directories, or tmpfs, e.g. a memory-backed /dev/shm).
- optionally a host name that resolves to loopback in its own /etc/hosts (:attr:`PodSpec.own_address`),
  and a slow link (:meth:`PodNetwork.limit_rate`: tc's token bucket filter on both ends of its cable;
  ``netem`` is not in this kernel, so bandwidth can be limited, not delay added).
  A mount point that does not exist on the host (``/root/.ssh``, ``/etc/mpi``) is made inside an
  overlay of its deepest existing parent directory, visible to that pod only (not of ``/``: a new
  top-level directory cannot be made; use one under /mnt or /srv).

Like Kubernetes' pause container, one long-lived process per pod holds its namespaces; every command
run in the pod (:meth:`Pod.popen`, :meth:`Pod.run`) enters them with ``nsenter``. Every name carries
this process's PID, so concurrent test sessions never collide, and :func:`pod_network` removes
everything on exit, even when the test fails: the processes in each pod (by PID, only those in
namespaces it made), the namespaces (with their interfaces), and the /etc/netns directories.

Usage (needs root, iproute2 and util-linux's nsenter/unshare)::

    from cluster.pods import Mount, PodSpec, pod_network, pods_unavailable

    specs = [PodSpec("a", resolves={"b.svc": "b"}), PodSpec("b", mounts=[Mount("/data", source=str(tmp))])]
    with pod_network(specs) as net:
        net["b"].popen(["python", "-m", "http.server", "8000"])
        net["a"].run(["curl", "http://b.svc:8000/"], check=True)

For an SSH server in a pod see :mod:`cluster.sshd`; for pods built from a Kubernetes object by an
operator's rules see ``tests/k8s/pod_runtime.py``.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import warm
from procs import stop_all

SUBNET_PREFIX = "10.77"
NETNS_ETC = "/etc/netns"
MAX_PODS = 200


@dataclass(frozen=True)
class Mount:
    """A mount in a pod: a host directory or file bound at ``target``, or a fresh tmpfs there (``source=None``)."""

    target: str
    source: str | None = None
    read_only: bool = False
    size: str | None = None
    """tmpfs size (e.g. ``64m``); default: the kernel's (half of the memory)."""


@dataclass(frozen=True)
class PodSpec:
    """One pod: its name, host name, the names it resolves and its mounts."""

    name: str
    """The pod's name (what the pod network is indexed by; not a Linux name)."""
    hostname: str | None = None
    """What ``hostname`` prints in the pod; default the pod's name."""
    resolves: Mapping[str, str] = field(default_factory=dict)
    """Names this pod resolves -> the pod they name (its address goes into the pod's /etc/hosts)."""
    search: Sequence[str] = ()
    """resolv.conf search domains (only consulted for names not in /etc/hosts)."""
    mounts: Sequence[Mount] = ()
    own_address: str | None = None
    """What the pod's host name resolves to in its /etc/hosts; default its address. ``127.0.1.1`` is
    what Debian's installer writes: the trap of a host name that resolves to loopback."""


class Pod:
    """A running pod: its namespaces, address and the processes started in it."""

    def __init__(self, spec: PodSpec, netns: str, addr: str) -> None:
        self.spec = spec
        self.name = spec.name
        self.netns = netns
        self.addr = addr
        self.ifname = "eth0"
        self.switch_port = ""
        """The peer of its eth0 in the switch namespace (traffic *to* the pod leaves there)."""
        self.hostname = spec.hostname or spec.name
        self.pause: subprocess.Popen | None = None
        self._procs: list[subprocess.Popen] = []

    def cmd(self, cmd: Sequence[str], cwd: str | os.PathLike | None = None) -> list[str]:
        """``cmd`` wrapped to run in this pod's network, UTS and mount namespaces."""
        assert self.pause is not None, f"pod {self.name} is not started"
        wd = [f"--wd={cwd}"] if cwd is not None else ["--wd=/"]
        return ["nsenter", f"--target={self.pause.pid}", "--net", "--uts", "--mount", *wd, "--", *cmd]

    def popen(self, cmd: Sequence[str], *, cwd: str | os.PathLike | None = None, **kw: Any) -> subprocess.Popen:
        """``subprocess.Popen`` in this pod (stopped at teardown if still running). nsenter execs the
        command, so the returned process's PID is the command's own; ``python -m shoal`` and the
        ``shoal`` console script start warm in the pod's namespaces (tests/warm.py)."""
        proc = warm.start(list(cmd), enter=self.pause.pid, cwd=cwd, **kw) or subprocess.Popen(self.cmd(cmd, cwd), **kw)
        self._procs.append(proc)
        return proc

    def run(
        self, cmd: Sequence[str], *, cwd: str | os.PathLike | None = None, **kw: Any
    ) -> subprocess.CompletedProcess:
        """``subprocess.run`` in this pod."""
        return warm.run(list(cmd), start=functools.partial(self.popen, cwd=cwd), **kw)

    def pids(self, *, live_only: bool = True) -> list[int]:
        """Processes in this pod's network namespace (the pause process included)."""
        out = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True).stdout.split()
        pids = [int(p) for p in out]
        return [p for p in pids if not live_only or _alive(p)]

    def workload_pids(self) -> list[int]:
        """Live processes in the pod other than the pause process: what a test may have left behind."""
        pause = self.pause.pid if self.pause else None
        return [p for p in self.pids() if p != pause]

    def kill_processes(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to every process in the pod but the pause process (a container crash)."""
        for pid in self.workload_pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop what runs here: SIGTERM to the processes started here, then SIGKILL to anything left."""
        stop_all(self._procs, grace_s)
        self._procs.clear()
        self.kill_processes()
        if self.pause is not None:
            if self.pause.poll() is None:
                self.pause.kill()
                self.pause.wait()
            for stream in (self.pause.stdout, self.pause.stderr):
                if stream is not None:
                    stream.close()


class PodNetwork:
    """The pods of one :func:`pod_network`, by name."""

    def __init__(self, pods: list[Pod], switch: str, subnet: int) -> None:
        self.pods = pods
        self.switch = switch
        self.subnet = subnet

    def __getitem__(self, name: str) -> Pod:
        for pod in self.pods:
            if pod.name == name:
                return pod
        raise KeyError(name)

    def __iter__(self) -> Iterator[Pod]:
        return iter(self.pods)

    def __len__(self) -> int:
        return len(self.pods)

    def limit_rate(self, pod: Pod, rate: str = "20mbit", *, direction: str = "both") -> None:
        """Limit ``pod``'s link to ``rate`` with tc's token bucket filter (``tbf``), as a slow NIC or
        cable would: on its eth0 (``egress``: what it sends), on its switch port (``ingress``: what it
        receives), or ``both``."""
        ends = {"egress": [(pod.netns, pod.ifname)], "ingress": [(self.switch, pod.switch_port)]}
        ends["both"] = ends["egress"] + ends["ingress"]
        for netns, dev in ends[direction]:
            _run("tc", "-n", netns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", "32kbit",
                 "latency", "400ms")  # fmt: skip


def left_behind(pods: Sequence[Pod], keep: Sequence[int] = (), settle_s: float = 15.0) -> dict[str, list[str]]:
    """Processes still alive in ``pods`` (pause processes, zombies and ``keep`` aside), each as
    ``PID COMMAND``, after giving them ``settle_s`` to go: a launcher that exited may leave children
    (ssh clients, workers) exiting for a moment after it, more so on a busy machine; an orphan stays."""
    deadline = time.monotonic() + settle_s
    while True:
        left = {pod.name: [p for p in pod.workload_pids() if p not in keep] for pod in pods}
        if not any(left.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return {name: [f"{pid} {_cmdline(pid)}" for pid in pids] for name, pids in left.items() if pids}


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "(gone)"


def pods_unavailable() -> str | None:
    """Why pods cannot be made here, or None if they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for program in ("ip", "nsenter", "unshare"):
        if shutil.which(program) is None:
            return f"`{program}` is not installed (iproute2, util-linux)"
    probe = f"shoalprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip() or made.returncode}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return None


@contextmanager
def pod_network(specs: Sequence[PodSpec], *, tag: str = "", subnet: int | None = None) -> Iterator[PodNetwork]:
    """Create the pods of ``specs`` on one bridge and start them; remove everything on exit.

    Args:
        specs: the pods, with distinct names; pod ``i`` gets address ``10.77.<subnet>.<i + 2>``.
        tag: a few characters making the namespace names unique within this process.
        subnet: the third byte of the addresses (default from the PID: only pods of one network share
            a link, so two networks with the same subnet never meet).
    """
    if len({s.name for s in specs}) != len(specs) or not 0 < len(specs) <= MAX_PODS:
        raise ValueError(f"need 1..{MAX_PODS} pods with distinct names, got {[s.name for s in specs]}")
    _remove_stale()
    prefix = f"shpod{os.getpid()}{tag}"
    subnet = (os.getpid() % 200) + 20 if subnet is None else subnet
    switch = f"{prefix}-sw"
    pods = [Pod(spec, f"{prefix}-{i}", f"{SUBNET_PREFIX}.{subnet}.{i + 2}") for i, spec in enumerate(specs)]
    made: list[str] = []
    with ExitStack() as cleanup:
        cleanup.callback(_teardown, pods, made)
        _ip("netns", "add", switch)
        made.append(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for i, pod in enumerate(pods):
            _ip("netns", "add", pod.netns)
            made.append(pod.netns)
            port = pod.switch_port = f"p{i}"
            _ip("link", "add", "eth0", "netns", pod.netns, "type", "veth", "peer", "name", port, "netns", switch)
            _ip("-n", switch, "link", "set", port, "master", "br0")
            _ip("-n", switch, "link", "set", port, "up")
            _ip("-n", pod.netns, "addr", "add", f"{pod.addr}/24", "dev", "eth0")
            _ip("-n", pod.netns, "link", "set", "eth0", "up")
            _ip("-n", pod.netns, "link", "set", "lo", "up")
        for pod in pods:
            _write_etc(pod, pods)
        for pod in pods:
            _start_pause(pod)
        yield PodNetwork(pods, switch, subnet)


def hosts_file(pod: Pod, pods: Sequence[Pod]) -> str:
    """The pod's /etc/hosts: loopback, its own names (as the kubelet writes them), then those it resolves."""
    by_name = {p.name: p for p in pods}
    own = pod.spec.own_address or pod.addr
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback", f"{own}\t{pod.hostname}"]
    for name, target in pod.spec.resolves.items():
        if target not in by_name:
            raise ValueError(f"pod {pod.name} resolves {name} to unknown pod {target}")
        lines.append(f"{by_name[target].addr}\t{name}")
    return "\n".join(lines) + "\n"


def _write_etc(pod: Pod, pods: Sequence[Pod]) -> None:
    etc = os.path.join(NETNS_ETC, pod.netns)
    os.makedirs(etc, exist_ok=True)
    with open(os.path.join(etc, "hosts"), "w") as f:
        f.write(hosts_file(pod, pods))
    with open(os.path.join(etc, "resolv.conf"), "w") as f:
        # Nothing answers on the pod's loopback port 53: a name missing from /etc/hosts fails at once.
        search = f"search {' '.join(pod.spec.search)}\n" if pod.spec.search else ""
        f.write(f"{search}nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")


def _setup_script(pod: Pod) -> str:
    """What the pause process runs before it sleeps: host name, private /run, overlays, mounts."""
    q = shlex.quote
    lines = ["set -e", f"hostname {q(pod.hostname)}", "mount -t tmpfs -o mode=755 tmpfs /run", "mkdir -m 755 /run/sshd"]
    overlays = sorted({_missing_parent(m.target) for m in pod.spec.mounts} - {None})
    for n, lower in enumerate(overlays):
        upper, work = f"/run/.pod/overlay{n}/upper", f"/run/.pod/overlay{n}/work"
        lines += [
            f"mkdir -p {upper} {work}",
            f"mount -t overlay overlay -o lowerdir={q(lower)},upperdir={upper},workdir={work} {q(lower)}",
        ]
    if any(lower == "/etc" or lower.startswith("/etc/") for lower in overlays):
        # The overlay hides what `ip netns exec` bound over /etc: bind the pod's files again.
        etc = os.path.join(NETNS_ETC, pod.netns)
        lines.append(f'for f in {q(etc)}/*; do mount --bind "$f" "/etc/${{f##*/}}"; done')
    for mount in pod.spec.mounts:
        target = q(mount.target)
        if mount.source is not None and os.path.isfile(mount.source):
            lines.append(f"mkdir -p {q(os.path.dirname(mount.target))}; [ -e {target} ] || : > {target}")
        else:
            lines.append(f"mkdir -p {target}")
        if mount.source is None:
            size = f",size={mount.size}" if mount.size else ""
            lines.append(f"mount -t tmpfs -o mode=1777{size} tmpfs {target}")
        else:
            lines.append(f"mount --bind {q(mount.source)} {target}")
            if mount.read_only:
                lines.append(f"mount -o remount,bind,ro {target}")
    lines += ["echo ready", "exec sleep infinity"]
    return "\n".join(lines)


def _missing_parent(target: str) -> str | None:
    """The deepest existing ancestor of ``target`` when ``target`` does not exist (it gets an overlay)."""
    if os.path.exists(target):
        return None
    parent = os.path.dirname(target.rstrip("/"))
    while parent and not os.path.isdir(parent):
        parent = os.path.dirname(parent)
    if parent in ("", "/"):
        raise ValueError(
            f"cannot make mount point {target}: its top-level directory does not exist on this machine "
            "(/ itself cannot be overlaid); mount under an existing one, such as /mnt or /srv"
        )
    return parent


def _start_pause(pod: Pod) -> None:
    pod.pause = subprocess.Popen(
        ["ip", "netns", "exec", pod.netns, "unshare", "--uts", "--", "sh", "-c", _setup_script(pod)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert pod.pause.stdout is not None
    line = pod.pause.stdout.readline()
    if line.strip() != "ready":
        pod.pause.kill()
        _, err = pod.pause.communicate()
        raise RuntimeError(f"pod {pod.name} did not start: {err.strip() or line.strip()}")


def _teardown(pods: Sequence[Pod], made: Sequence[str]) -> None:
    for pod in pods:
        if pod.netns in made:
            pod.stop()
    for netns in made:  # a namespace takes its interfaces with it (the switch: the bridge and peers)
        subprocess.run(["ip", "netns", "delete", netns], capture_output=True)
        shutil.rmtree(os.path.join(NETNS_ETC, netns), ignore_errors=True)


def _remove_stale() -> None:
    """Remove what a killed test session left: namespaces whose PID tag names no running process."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        match = re.match(r"shpod(\d+)", name)
        if match and not _alive(int(match.group(1))):
            pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
            if pids:
                continue  # something still runs there: not ours to end
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
            shutil.rmtree(os.path.join(NETNS_ETC, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    """True if ``pid`` runs and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False


def _ip(*args: str) -> None:
    _run("ip", *args)


def _run(*cmd: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
