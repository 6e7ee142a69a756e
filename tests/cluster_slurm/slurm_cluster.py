"""A real one-node Slurm cluster for the tests: munged, slurmctld and slurmd started by hand.

Everything lives in a fresh temporary directory: slurm.conf (point ``SLURM_CONF`` at it), a private
munge key and socket, state, spool, logs and pid files; the daemons listen on ports picked free, so
test sessions running at the same time, or a system Slurm, do not interfere. No systemd: each
daemon is started directly and stopped by the PID in its pid file (SIGTERM, then SIGKILL).

The fixture is a session fixture imported once, by the top-level conftest.py, rather than defined
in a ``conftest.py`` here: a second ``conftest`` module would replace the
top-level one in ``sys.modules`` and break the ``from conftest import ...`` of tests collected
after this directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from procs import wait_for

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("srun", "sbatch", "scontrol", "squeue", "sinfo", "scancel")


def slurm_unavailable() -> str | None:
    """Why a Slurm cluster cannot be started here, or None."""
    if os.geteuid() != 0:
        return "starting slurmd and munged needs root"
    missing = [p for p in (*DAEMONS, *CLIENTS, "mungekey", "runuser") if _which(p) is None]
    if missing:
        return f"not installed: {', '.join(missing)} (scripts/install-system-deps.sh installs Slurm and munge)"
    return None


def _which(program: str) -> str | None:
    return shutil.which(program) or shutil.which(program, path="/usr/sbin:/sbin")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class SlurmCluster:
    """One node (this machine, 127.0.0.1) in partition ``debug``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "slurm.conf"
        self.hostname = socket.gethostname().split(".")[0]
        self.cpus = max(2, os.cpu_count() or 1)  # 2 tasks even on 1 core: config_overrides trusts it
        self.started: list[tuple[str, Path]] = []

    @property
    def env(self) -> dict[str, str]:
        """The environment for clients (srun, sbatch...): SLURM_CONF, and this venv first on PATH."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
        for name in [n for n in env if n.startswith(("SLURM_", "SBATCH_", "SRUN_")) and n != "SLURM_CONF"]:
            del env[name]  # running inside a real allocation must not leak into this cluster
        env.pop("SHOAL_ENV", None)
        return env

    def start(self) -> None:
        munge = self.root / "munge"
        munge.mkdir()
        shutil.chown(munge, "munge", "munge")
        os.chmod(munge, 0o755)  # munged: clients need to reach the socket; the key stays 0600
        key = munge / "munge.key"
        self._run("runuser", "-u", "munge", "--", _which("mungekey"), "--create", f"--keyfile={key}")
        self._daemon(
            "munged",
            munge / "munged.pid",
            [
                "runuser",
                "-u",
                "munge",
                "--",
                _which("munged"),
                f"--socket={munge / 'socket'}",
                f"--key-file={key}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={munge / 'munged.log'}",
                f"--seed-file={munge / 'munged.seed'}",
            ],
        )
        for sub in ("state", "spool"):
            (self.root / sub).mkdir()
        self.conf.write_text(self._slurm_conf(munge / "socket"))
        self._daemon("slurmctld", self.root / "slurmctld.pid", [_which("slurmctld"), "-f", str(self.conf)])
        self._daemon("slurmd", self.root / "slurmd.pid", [_which("slurmd"), "-f", str(self.conf), "-N", self.hostname])
        self._wait_idle(timeout=30)

    def _slurm_conf(self, munge_socket: Path) -> str:
        r = self.root
        return "\n".join(
            [
                "ClusterName=shoaltest",
                f"SlurmctldHost={self.hostname}(127.0.0.1)",
                f"SlurmctldPort={_free_port()}",
                f"SlurmdPort={_free_port()}",
                "SlurmUser=root",
                "SlurmdUser=root",
                "AuthType=auth/munge",
                "CredType=cred/munge",
                f"AuthInfo=socket={munge_socket}",
                "MpiDefault=none",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core",
                "SlurmdParameters=config_overrides",
                "ReturnToService=2",
                "AccountingStorageType=accounting_storage/none",
                "JobCompType=jobcomp/none",
                "JobAcctGatherType=jobacct_gather/none",
                "MinJobAge=300",  # finished jobs stay visible to `scontrol show job` for 5 minutes
                # Job ids decide the port shoal derives for a job (15000 + id % 5000): a cluster that
                # counts from 1 in every session would always take 15001, 15002... which another
                # test's fake SLURM_JOB_ID=1 may hold at that moment under pytest-xdist.
                f"FirstJobId={1000 + os.getpid() % 3000}",
                "KillWait=5",
                f"StateSaveLocation={r / 'state'}",
                f"SlurmdSpoolDir={r / 'spool'}",
                f"SlurmctldPidFile={r / 'slurmctld.pid'}",
                f"SlurmdPidFile={r / 'slurmd.pid'}",
                f"SlurmctldLogFile={r / 'slurmctld.log'}",
                f"SlurmdLogFile={r / 'slurmd.log'}",
                f"NodeName={self.hostname} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=1000 State=UNKNOWN",
                f"PartitionName=debug Nodes={self.hostname} Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        )

    def _run(self, *argv: str) -> subprocess.CompletedProcess:
        proc = subprocess.run(list(argv), capture_output=True, text=True, env=self.env, timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def _daemon(self, name: str, pid_file: Path, argv: list[str]) -> None:
        """Start a daemon that forks into the background and writes ``pid_file``."""
        self._run(*argv)
        wait_for(
            lambda: pid_file.exists() and pid_file.read_text().strip(), 15, 0.05, f"{name}'s pid file {pid_file}",
            details=self.logs,
        )  # fmt: skip
        self.started.append((name, pid_file))

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, env=self.env)
            state = proc.stdout.strip() or proc.stderr.strip()
            if state == "idle":
                return
            time.sleep(0.2)
        raise RuntimeError(f"the Slurm node is not idle after {timeout:.0f} s (state: {state!r}):\n{self.logs()}")

    def logs(self) -> str:
        out = []
        for path in (self.root / "slurmctld.log", self.root / "slurmd.log", self.root / "munge" / "munged.log"):
            if path.exists():
                out.append(f"--- {path.name} (last lines)\n" + "\n".join(path.read_text().splitlines()[-15:]))
        return "\n".join(out)

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (JobState, ExitCode, StdOut, ...)."""
        proc = self._run("scontrol", "-o", "show", "job", job_id)
        fields = {}
        for word in proc.stdout.split():
            key, sep, value = word.partition("=")
            if sep:
                fields[key] = value
        return fields

    def wait_job(self, job_id: str, timeout: float) -> dict[str, str]:
        """Poll until the job ends (sacct needs accounting, which this cluster does not run)."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if info.get("JobState") not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"):
                return info
            if time.monotonic() > deadline:
                self._run("scancel", job_id)
                raise AssertionError(f"job {job_id} still {info.get('JobState')} after {timeout:.0f} s")
            time.sleep(0.5)

    def stop(self) -> None:
        """Cancel what still runs, then stop the daemons this cluster started (newest first)."""
        if any(name == "slurmctld" for name, _ in self.started):
            subprocess.run(["scancel", "--user", "root"], capture_output=True, env=self.env, timeout=30)
        for _name, pid_file in reversed(self.started):
            try:
                pid = int(pid_file.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            _terminate(pid)
        self.started.clear()


def _terminate(pid: int, timeout: float = 10.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@pytest.fixture(scope="session")
def slurm():
    """A running one-node Slurm cluster; tests run its clients with ``env=slurm.env``."""
    reason = slurm_unavailable()
    if reason:
        pytest.skip(reason)
    # munged (user munge) must reach its directory inside: not under the session's TMPDIR, which is in
    # pytest's directory of mode 0700 (tests/conftest.py); removed below.
    root = Path(tempfile.mkdtemp(prefix="shoal-slurm-", dir="/tmp"))
    os.chmod(root, 0o755)
    cluster = SlurmCluster(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
