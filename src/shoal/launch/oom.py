"""Was a worker killed by SIGKILL the kernel's out-of-memory killer? The kernel's own records say.

A worker killed by SIGKILL (``exitcode: -9`` in torch's table) is most often the kernel's
out-of-memory killer. :func:`sigkill_cause` says whether it was: from the kernel's log
(``/dev/kmsg``: "Killed process PID", exact, when readable) and from the OOM kill counter of the
launcher's memory cgroup, which its workers share (``memory.events`` ``oom_kill`` in cgroup v2,
``memory.oom_control`` in v1), compared with its value before the workers started
(:func:`memory_state`, taken by the launch core at every launch). The failure report then names the
rank, the host and the memory limit, or says it was not an OOM kill.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

_OOM_RECORD = re.compile(r"Killed process (\d+) |oom-kill:.*[,:]pid=(\d+),")
_UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as 2**63 minus a page
UNKNOWN_CAUSE = "often the out-of-memory killer: see `dmesg`"


@dataclass(frozen=True)
class MemoryState:
    """This process's memory cgroup (its workers inherit it) and the kernel's OOM kill count there."""

    cgroup: str | None
    """The cgroup as ``/proc/self/cgroup`` names it (None: not found)."""
    directory: str | None
    """Its directory in the cgroup file system (v2's, or v1's memory hierarchy)."""
    oom_kills: int | None
    """Processes of that cgroup (and below) the OOM killer killed so far (None: unreadable)."""
    limit: int | None
    """The smallest memory limit between that cgroup and the root, in bytes (None: none)."""
    when: float
    """``time.monotonic()`` when read: the kernel log's clock."""


@dataclass(frozen=True)
class SigkillCause:
    """Whether the OOM killer sent a SIGKILL (None: nothing readable says), the evidence, a hint."""

    oom: bool | None
    evidence: str
    hint: str | None = None

    @property
    def clause(self) -> str:
        """What follows "killed by SIGKILL on HOST" in the report's summary line."""
        if self.oom is None:
            return f" ({self.evidence})"
        if self.oom:
            return f": the kernel's out-of-memory killer ({self.evidence})"
        return (
            f", not by the out-of-memory killer ({self.evidence}): something else sent it (`kill -9`, a "
            "scheduler enforcing a time or memory limit: see `sacct` or `kubectl describe pod`, a node agent)"
        )


def memory_state() -> MemoryState:
    """This process's memory cgroup, its OOM kill counter and limit (cgroup v2, else v1)."""
    try:
        with open("/proc/self/cgroup") as f:
            cgroups = [line.rstrip("\n").split(":", 2)[1:] for line in f if line.count(":") >= 2]
        with open("/proc/self/mountinfo") as f:
            mounts = [(m[3], m[4], m[m.index("-") + 1], m[-1].split(",")) for m in map(str.split, f)]
    except (OSError, ValueError):
        return MemoryState(None, None, None, None, time.monotonic())
    for version, path in [(2, p) for c, p in cgroups if not c] + [
        (1, p) for c, p in cgroups if "memory" in c.split(",")
    ]:
        for root, point, fstype, options in mounts:
            if fstype != ("cgroup2" if version == 2 else "cgroup") or (version == 1 and "memory" not in options):
                continue
            directory = os.path.join(point, (path[len(root) :] if path.startswith(root) else path).lstrip("/"))
            kills = _read_key(os.path.join(directory, "memory.events" if version == 2 else "memory.oom_control"))
            if kills is None:
                continue
            limits = []
            for depth in range(directory.count("/") - point.count("/") + 1):  # up to the mount point
                text = _read(
                    os.path.join(directory, *[".."] * depth, "memory.max" if version == 2 else "memory.limit_in_bytes")
                )
                if text.isdigit() and int(text) < _UNLIMITED:
                    limits.append(int(text))
            return MemoryState(path, directory, kills, min(limits, default=None), time.monotonic())
    return MemoryState(None, None, None, None, time.monotonic())


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _read_key(path: str, key: str = "oom_kill") -> int | None:
    for line in _read(path).splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None


def kernel_oom_record(pid: int, since: float | None = None) -> str | None:
    """The kernel log's record of the OOM killer killing ``pid`` (not before monotonic ``since``), if readable."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:  # no /dev/kmsg, or not allowed (kernel.dmesg_restrict=1 without CAP_SYSLOG)
        return None
    found = None
    try:
        while True:
            try:
                header, _, message = os.read(fd, 8192).decode("utf-8", errors="replace").partition(";")
            except BlockingIOError:
                break
            except OSError:  # EPIPE: that record was overwritten while reading; go on with the next
                continue
            match = _OOM_RECORD.search(message)
            stamp = header.split(",")[2] if header.count(",") >= 2 else ""
            if not match or int(match.group(1) or match.group(2)) != pid:
                continue
            if since is not None and stamp.isdigit() and int(stamp) / 1e6 < since - 1:
                continue  # an earlier process that had the same PID
            if found is None or "Killed process" in message:
                found = message.strip()
    finally:
        os.close(fd)
    return found


def sigkill_cause(pid: int, *, before: MemoryState) -> SigkillCause:
    """Why worker ``pid`` got SIGKILL: the kernel log, else its cgroup's OOM kill counter since ``before``."""
    now = memory_state()
    counted = None
    if before.oom_kills is not None and now.oom_kills is not None:
        limit = f" (limit {_size(now.limit)})" if now.limit else ""
        change = (
            f"still {now.oom_kills}" if now.oom_kills == before.oom_kills else f"{before.oom_kills} -> {now.oom_kills}"
        )
        counted = f"OOM kills in memory cgroup {now.cgroup}{limit}: {change}"
    record = kernel_oom_record(pid, since=before.when)
    hint = (
        f"the node ran out of memory{f' ({_size(now.limit)} for the launcher and its workers)' if now.limit else ''}: "
        "lower the batch size, the DataLoader workers or the model's footprint, or give the job more memory "
        "(the container's, pod's or Slurm job's memory limit)"
    )
    if record:
        record = record.split(", file-rss")[0][:160]  # "...: Killed process 123 (python) total-vm:..., anon-rss:...kB"
        return SigkillCause(True, f"kernel: {record}" + (f"; {counted}" if counted else ""), hint)
    if counted and now.oom_kills > before.oom_kills:  # type: ignore[operator]
        return SigkillCause(True, counted, hint)
    if counted:
        return SigkillCause(False, counted)
    return SigkillCause(None, UNKNOWN_CAUSE)


def _size(nbytes: int | None) -> str:
    nbytes = nbytes or 0
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB"


AT_IMPORT = memory_state()
"""The counter when this module was first imported (before any worker of a command-line launch)."""
"""The state before this launcher started any worker (the launch core imports this module first)."""
