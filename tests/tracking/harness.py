"""What the tracking tests share: the environment the tools run in, the job script and its runner,
and the checks on a server's sockets."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

SCRIPTS = Path(__file__).parent / "scripts"
JOB = SCRIPTS / "tracked_job.py"
BIN = Path(sys.executable).parent


def tool_environment(home: Path) -> dict[str, str]:
    """The environment the job and the readers run in: no credentials, nothing written outside
    ``home``, no telemetry, and loopback never sent through a proxy."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_", "SHOAL_"))}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)
    home.mkdir(parents=True, exist_ok=True)
    env.update(
        HOME=str(home),
        NETRC=str(home / "netrc-none"),
        WANDB_CONFIG_DIR=str(home / "wandb-config"),
        WANDB_CACHE_DIR=str(home / "wandb-cache"),
        WANDB_DATA_DIR=str(home / "wandb-data"),
        WANDB_ERROR_REPORTING="false",
        MLFLOW_DISABLE_TELEMETRY="true",
        DO_NOT_TRACK="true",
        NO_PROXY="127.0.0.1,localhost",
        OMP_NUM_THREADS="1",
    )
    return env


def run_job(plan: dict, results: Path, env: dict[str, str], *, nproc: int = 1, prefix=(), timeout: float = 240):
    """Run the job script (under torchrun when ``nproc`` > 1); return (process, results by rank)."""
    results.mkdir(parents=True, exist_ok=True)
    plan = {"result_dir": str(results), **plan}
    launcher = [sys.executable]
    if nproc > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    cmd = [*prefix, *launcher, str(JOB), json.dumps(plan)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    found = {int(p.stem[4:]): json.loads(p.read_text()) for p in results.glob("rank*.json")}
    return proc, found


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def answers(url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:
                pids.append(int(entry.name))
    return pids


def non_loopback_sockets(pids: list[int]) -> list[str]:
    """TCP connections of ``pids`` whose local or remote address is not loopback (or unspecified)."""
    inodes = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    foreign = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] not in inodes:
                continue
            for end in (fields[1], fields[2]):
                address = _address(end.split(":")[0])
                if not (address.is_loopback or address.is_unspecified):
                    foreign.append(f"{fields[1]} -> {fields[2]}")
    return foreign


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))  # four host-order words
    address = ipaddress.IPv6Address(words)
    return address.ipv4_mapped or address
