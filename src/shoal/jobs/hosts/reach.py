"""Before a job starts anywhere: can this machine log in to every host without a password?

``shoal launch --hosts`` (over SSH, or through mpirun, which starts its daemons over SSH) runs
``ssh -o BatchMode=yes HOST true`` on every other host at once. A host that refuses, rejects the
key, cannot be resolved or does not answer is named in one line with what to do, before any
process has been started on any host, so nothing is left behind and nothing waits on a password
prompt. With ``--rsh PROGRAM`` the check is ``PROGRAM HOST true``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Sequence

from shoal.errors import ShoalError

CONNECT_TIMEOUT_S = 10
"""How long ssh waits for a host's port to answer."""
CHECK_TIMEOUT_S = 30.0
"""How long the whole check may take (connect, key exchange, running ``true``)."""


def check_reachable(hosts: Sequence[str], rsh: str | None = None, *, mpirun: bool = False) -> None:
    """Raise ShoalError naming the first host of ``hosts`` that ``true`` cannot be run on."""
    if not hosts:
        return
    if rsh:
        base = shlex.split(rsh)
    else:
        base = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}"]
        if mpirun:  # the options mpirun's own ssh will get (the MPI operator sets some)
            base += shlex.split(os.environ.get("OMPI_MCA_plm_rsh_args", ""))  # noqa: SIM112 (Open MPI's spelling)
    procs = {
        host: subprocess.Popen(
            [*base, host, "true"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for host in hosts
    }
    deadline = time.monotonic() + CHECK_TIMEOUT_S
    failures: list[tuple[str, str]] = []
    for host, proc in procs.items():
        try:
            _, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            failures.append((host, f"no answer within {CHECK_TIMEOUT_S:g} s"))
            continue
        if proc.returncode != 0:
            lines = [line.strip() for line in err.splitlines() if line.strip() and not line.startswith("Warning:")]
            failures.append((host, lines[-1] if lines else f"exit status {proc.returncode}"))
    if failures:
        host, reason = failures[0]
        program = os.path.basename(base[0])
        more = f" (and {len(failures) - 1} more host{'s' if len(failures) > 2 else ''})" if len(failures) > 1 else ""
        raise ShoalError(f"cannot run a command on {host} over {program}: {reason}{more}", _hint(host, reason, program))


def _hint(host: str, reason: str, program: str) -> str:
    text = reason.lower()
    if "connection refused" in text:
        return f"start the SSH server on {host} (or give its port in ~/.ssh/config), then retry"
    if "permission denied" in text or "too many authentication failures" in text:
        return (
            f"install your public key on {host} (ssh-copy-id {host}) so that `ssh -o BatchMode=yes {host} true` "
            "works without a password"
        )
    if "resolve" in text or "name or service not known" in text:
        return f"check the host name {host} in --hosts or the hostfile: this machine cannot resolve it"
    if "host key verification failed" in text:
        return f"accept {host}'s host key once (`ssh {host} true`), or add it to ~/.ssh/known_hosts"
    if "timed out" in text or "no route" in text or "no answer" in text:
        return f"check that {host} is up and that its SSH port is reachable from this machine"
    return f"check that `{program} {host} true` works from this machine without a prompt"
