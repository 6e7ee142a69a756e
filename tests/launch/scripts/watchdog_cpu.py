"""What the watchdog costs in CPU time, which a loaded machine does not blur as it blurs wall time:
``shoal.fit(WORKLOAD, nproc=2)`` alternately with the watchdog on and off (``SHOAL_WATCHDOG``), each
in a fresh interpreter; per run the launcher's own CPU seconds (its monitor thread polls every
second) and its workers' (the progress calls in every step).

    python tests/launch/scripts/watchdog_cpu.py [--workload digits] [--epochs 100] [--pairs 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

ONE_RUN = """
import os, resource, sys, tempfile, time
import shoal
out = tempfile.mkdtemp(prefix="watchdog-cpu-")
started = time.time()
shoal.fit(sys.argv[1], epochs=int(sys.argv[2]), nproc=2, out=out + "/run", progress=False, checkpoint_every="off")
wall = time.time() - started
me, workers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(wall, me.ru_utime + me.ru_stime, workers.ru_utime + workers.ru_stime)
import shutil; shutil.rmtree(out, ignore_errors=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="digits")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args()
    for pair in range(1, args.pairs + 1):
        for on in ("1", "0"):
            env = {**__import__("os").environ, "SHOAL_WATCHDOG": on}
            command = [sys.executable, "-c", ONE_RUN, args.workload, str(args.epochs)]
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            wall, launcher, workers = (float(x) for x in done.stdout.split()[-3:])
            print(
                f"pair {pair} watchdog {'on ' if on == '1' else 'off'}: wall {wall:5.1f} s, "
                f"launcher CPU {launcher:5.2f} s, workers' CPU {workers:6.2f} s",
                flush=True,
            )


if __name__ == "__main__":
    main()
