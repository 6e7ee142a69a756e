"""The probe of ``python -m benchmarks.startup``: join the group, finish one DDP training step, stamp the time.

One definition, three ways in:

* as a script under a launcher (torchrun, ``shoal run``, accelerate, ``fabric run``):
  ``python startup_probe.py OUT_DIR``; each rank writes ``OUT_DIR/rank<R>.txt``;
* as a function entrypoint of ``launch_local`` (:func:`launch_probe`, the ``launch_*`` variants);
* ``python startup_probe.py --import-only OUT_DIR``: one process that imports ``torch.distributed``
  and stamps the time, the floor every worker pays (the ``import_torch`` variant);
* ``python startup_probe.py --launcher OUT_DIR NAME MODULE ARGS...``: a launcher (``shoal``,
  ``torch.distributed.run``) run as ``python -m MODULE ARGS...`` would, after importing what it
  imports and stamping that moment in ``OUT_DIR/launcher-NAME.txt`` (benchmarks/scale_curves.py's
  phases).

Besides its stamp, each rank of :func:`probe` writes ``OUT_DIR/phases-<R>.json``: when its process
started, when torch was imported, when its process group was ready and when its first step ended
(``time.time()``), and its host name.

torch is imported inside the functions: whoever imports this module to launch the probe (a parent
that forks its workers) has not imported torch itself.
"""

import gc
import json
import os
import socket
import sys
import time


def probe(out_dir: str) -> None:
    """One rank: a gloo group, one DDP step of a ``Linear(8, 2)`` (the gradient all-reduce and the
    first ``optimizer.step()`` included), then this rank's stamp in ``out_dir``."""
    import torch
    import torch.distributed as dist

    imported = time.time()
    dist.init_process_group("gloo")
    grouped = time.time()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(4, 8)).sum().backward()  # the gradient all-reduce
    optimizer.step()
    stamp = time.time()
    rank = dist.get_rank()
    dist.destroy_process_group()
    gc.collect()  # torch 2.14's gloo can abort at exit otherwise (see shoal.distributed.process_group)
    _stamp(out_dir, rank, stamp)
    phases = {"started": _process_start(), "imported": imported, "grouped": grouped, "stepped": stamp}
    with open(os.path.join(out_dir, f"phases-{rank}.json"), "w") as f:
        json.dump({**phases, "host": socket.gethostname()}, f)


def _process_start() -> float | None:
    """When this process started (``time.time()``'s clock, to the kernel's 10 ms tick), from
    /proc/self/stat's start time since boot; None where there is no /proc."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    since_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime, in clock ticks
    return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)


LAUNCHER_IMPORTS = {
    "shoal": ("shoal.cli.main", "shoal.cli.run", "shoal.launch.core", "torch.distributed.run",
              "torch.distributed.elastic.rendezvous.dynamic_rendezvous",
              "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend"),
    "torch.distributed.run": ("torch.distributed.run",),
}  # fmt: skip
"""What each launcher imports before its rendezvous (imported here first, then stamped); shoal
imports torch's agent lazily, when it launches."""


def launcher(out_dir: str, name: str, module: str, args: list[str]) -> None:
    """Run ``python -m module args`` after importing its modules and stamping that moment."""
    import importlib
    import runpy

    for imported in LAUNCHER_IMPORTS.get(module, (module,)):
        importlib.import_module(imported)
    with open(os.path.join(out_dir, f"launcher-{name}.txt"), "w") as f:
        f.write(repr(time.time()))
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def import_only(out_dir: str) -> None:
    """Import ``torch.distributed`` and stamp the time as rank 0: what a worker pays before any work."""
    import torch.distributed  # noqa: F401

    _stamp(out_dir, 0, time.time())


def launch_probe(start_method: str, nproc: int, out_dir: str) -> None:
    """``launch_local(probe, (out_dir,), nproc)``: what ``shoal train --nproc`` does with its entrypoint."""
    from shoal.launch.local import launch_local

    launch_local(probe, (out_dir,), nproc, start_method=start_method)


def _stamp(out_dir: str, rank: int, stamp: float) -> None:
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
        f.write(repr(stamp))


if __name__ == "__main__":
    if sys.argv[1] == "--import-only":
        import_only(sys.argv[2])
    elif sys.argv[1] == "--launcher":
        launcher(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
    else:
        probe(sys.argv[1])
