"""torchft's lighthouse for replica groups that another program starts: ``python -m shoal.train.ft.serve_lighthouse``.

The sbatch script that ``shoal launch slurm`` renders for ``shoal train --fault-tolerance`` runs it
on the batch host, outside every replica group (:mod:`shoal.jobs.slurm_fault_tolerance`)::

    head_addr=$(python -m shoal.train.ft.serve_lighthouse --address)
    python -m shoal.train.ft.serve_lighthouse --bind "$head_addr:$port" &

``--address`` prints this host's address as the job's other nodes reach it: the address its name
resolves to, or, where the name resolves to loopback here (Debian's /etc/hosts maps it to
127.0.1.1), the address of the default route's interface (:func:`shoal.env.network.route_to`, the
rule node 0 of a job started by hand follows). ``--bind HOST:PORT`` serves the lighthouse there, with
shoal's settings, restarted when it dies (:class:`shoal.train.ft.lighthouse.Lighthouse`), until
SIGTERM or SIGINT. Bad input is one line and a HINT, exit status 2.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import threading

from shoal.console import write_line
from shoal.env.network import bracket, route_to
from shoal.errors import ShoalError
from shoal.launch.ports import check_port_free
from shoal.train.ft.lighthouse import Lighthouse

_WILDCARDS = frozenset({"", "0.0.0.0", "::"})


def own_address() -> str:
    """This host's address toward the other nodes of its job (bracketed when IPv6)."""
    return bracket(route_to(socket.gethostname()).addr)


def serve(bind: str, groups: int | None = None) -> None:
    """Serve the lighthouse on ``bind`` (``HOST:PORT``, an address) until SIGTERM or SIGINT, for a job
    of ``groups`` replica groups (they set its heartbeat timeout; None: up to 256)."""
    host, _, port = bind.rpartition(":")
    host = host.strip("[]")
    if host in _WILDCARDS or not port.isdigit():
        raise ShoalError(
            f"--bind {bind!r} is not an address and port of this host",
            "give --bind ADDR:PORT with this host's address (`--address` prints it), never 0.0.0.0 or [::]",
        )
    # Said once, here: the lighthouse would otherwise fail to bind, and be restarted, again and again.
    check_port_free(
        int(port),
        host,
        hint="another job holds it (shoal launch slurm --master-port), or the address is not this host's",
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with Lighthouse(host, int(port), groups=groups) as lighthouse:
        write_line(f"shoal: torchft's lighthouse serving on {lighthouse.url} (pid {lighthouse.pid})")
        stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m shoal.train.ft.serve_lighthouse", description=__doc__.split("\n")[0]
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--address", action="store_true", help="print this host's address toward the other nodes")
    what.add_argument("--bind", metavar="ADDR:PORT", help="serve the lighthouse there until SIGTERM or SIGINT")
    parser.add_argument("--groups", type=int, help="the job's replica groups: above 256 a longer heartbeat timeout")
    args = parser.parse_args(argv)
    try:
        if args.address:
            print(own_address(), flush=True)
        else:
            serve(args.bind, args.groups)
    except ShoalError as err:
        print(err.format(), file=sys.stderr, flush=True)
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
