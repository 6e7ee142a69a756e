"""Run one rank's command under mpirun and print its exit status for ``shoal launch`` to collect.

``python -m shoal.jobs.hosts.rank_status [--ranks-per-node N,...] -- COMMAND...`` (see
:func:`shoal.jobs.hosts.render.render_mpirun`, ``report_status``) starts COMMAND in the environment
:func:`shoal.launch.as_torchrun.environment_for` gives a rank (torchrun's variables, so an unchanged
torchrun-style script runs, and the exit hook), waits for it and writes
``shoal-rank-status: rank=R status=S`` to stderr, which mpirun relays to ``shoal launch``
(:func:`shoal.jobs.hosts.processes.supervise_mpirun`). A signal sent to this process (mpirun stopping the
job) is passed on to COMMAND, whose status is then reported as 128+N. Imports no torch: it adds about
0.3 s to each rank's start (measured on a busy 2-core machine; torch's own import takes 2-4 s).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence

from shoal.errors import ShoalError
from shoal.jobs.hosts.processes import STATUS_MARKER
from shoal.launch.as_torchrun import environment_for, parse_argv


def main(argv: Sequence[str] | None = None) -> int:
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
    try:
        ranks_per_node, command = parse_argv(sys.argv[1:] if argv is None else argv)
        env = environment_for(os.environ, command, ranks_per_node)
        proc = subprocess.Popen(command, env=env)
    except ShoalError as err:
        print(err.format(), file=sys.stderr, flush=True)
        code = err.exit_code
    except OSError as err:
        print(f"shoal: cannot run {command[:1]}: {err.strerror}", file=sys.stderr, flush=True)
        code = 127
    else:

        def forward(signum, _frame):
            try:
                proc.send_signal(signum)
            except ProcessLookupError:
                pass

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, forward)
        status = proc.wait()
        code = 128 - status if status < 0 else status
    sys.stderr.write(f"{STATUS_MARKER} rank={rank} status={code}\n")
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    raise SystemExit(main())
