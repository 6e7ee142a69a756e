"""A real OpenSSH server (Debian's openssh-server) inside a pod of :mod:`cluster.pods`, and its keys.

:func:`start_sshd` writes a configuration of its own (a host key made for it, ``AuthorizedKeysFile``,
``PidFile``, ``UsePAM no``, ``StrictModes no`` since the keys live in temporary directories), starts
``sshd -De -f CONFIG`` in the pod (the MPI operator's worker command plus the configuration), waits
until it listens, and stops it by its PID (:meth:`Sshd.stop`; the pod's teardown also ends it).
:func:`ssh_keypair` makes a key pair as the MPI operator does (ECDSA P-521, PEM). ``/run/sshd``,
which sshd needs for privilege separation, exists in every pod's private /run.

Usage::

    key = ssh_keypair(tmp_path / "keys")
    with pod_network([PodSpec("head"), PodSpec("node1")]) as net:
        server = start_sshd(net["node1"], tmp_path / "sshd", authorized_keys=key.public)
        net["head"].run(["ssh", "-i", str(key.private), *SSH_OPTIONS, net["node1"].addr, "true"], check=True)
        server.stop()
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cluster.pods import Pod
from procs import wait_for

SSHD = "/usr/sbin/sshd"
SSH_OPTIONS = ("-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes")
"""Client options for a server whose host key is new each run (the MPI operator's images set the same)."""


def sshd_unavailable() -> str | None:
    """Why no sshd can be started here, or None."""
    for program in (SSHD, "ssh", "ssh-keygen"):
        if shutil.which(program) is None:
            return f"{program} is not installed (openssh-server, openssh-client: scripts/install-system-deps.sh)"
    return None


@dataclass(frozen=True)
class KeyPair:
    private: Path
    public: Path

    def authorized_keys(self, directory: Path) -> Path:
        """An authorized_keys file in ``directory`` holding this public key."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "authorized_keys"
        path.write_text(self.public.read_text())
        path.chmod(0o600)
        return path


def ssh_keypair(directory: Path, name: str = "id_rsa", kind: str = "ecdsa", bits: int = 521) -> KeyPair:
    """A new key pair in ``directory`` (default as the MPI operator's: ECDSA P-521, PEM, file id_rsa)."""
    directory.mkdir(parents=True, exist_ok=True)
    private = directory / name
    subprocess.run(
        [
            "ssh-keygen",
            "-q",
            "-t",
            kind,
            "-b",
            str(bits),
            "-m",
            "PEM",
            "-N",
            "",
            "-C",
            "shoal-test",
            "-f",
            str(private),
        ],
        check=True,
        capture_output=True,
    )
    private.chmod(0o600)
    return KeyPair(private, Path(f"{private}.pub"))


@dataclass
class Sshd:
    """An sshd running in a pod."""

    pod: Pod
    proc: subprocess.Popen
    log: Path
    config: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        """Stop the server by its PID (SIGTERM, then SIGKILL); sessions it started end with the pod."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def accepted(self) -> list[str]:
        """The log's ``Accepted publickey ...`` lines: who logged in, from where."""
        return [line for line in self.log.read_text(errors="replace").splitlines() if "Accepted publickey" in line]


def start_sshd(
    pod: Pod,
    workdir: Path,
    *,
    authorized_keys: str | os.PathLike,
    argv: Sequence[str] = (SSHD, "-De"),
    port: int = 22,
    timeout_s: float = 20.0,
) -> Sshd:
    """Start ``argv -f CONFIG`` (sshd in the foreground, logging to stderr) in ``pod``.

    ``authorized_keys``: the file sshd reads for root's keys, as the pod sees it (a path on the host,
    or one a mount provides in the pod, such as /root/.ssh/authorized_keys).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    host_key = workdir / "ssh_host_ed25519_key"
    if not host_key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    config = workdir / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 0.0.0.0",
                f"HostKey {host_key}",
                f"AuthorizedKeysFile {authorized_keys}",
                f"PidFile {workdir / 'sshd.pid'}",
                "UsePAM no",
                "StrictModes no",
                "PermitRootLogin prohibit-password",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "LogLevel INFO",
                "",
            ]
        )
    )
    log = workdir / "sshd.log"
    with open(log, "w") as out:
        proc = pod.popen([*argv, "-f", str(config)], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    server = Sshd(pod, proc, log, config)
    try:
        wait_for(
            lambda: "Server listening on 0.0.0.0" in log.read_text(errors="replace"), timeout_s, 0.05,
            f"sshd in pod {pod.name} listening", unless=lambda: proc.poll() is not None,
            details=lambda: log.read_text(errors="replace"),
        )  # fmt: skip
    except TimeoutError:
        server.stop()
        raise
    return server
