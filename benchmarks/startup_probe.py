"""The probe of ``python -m benchmarks.startup``: join the group, finish one DDP training step, stamp the time.

One definition, three ways in:

* as a script under a launcher (torchrun, ``shoal run``, accelerate, ``fabric run``):
  ``python startup_probe.py OUT_DIR``; each rank writes ``OUT_DIR/rank<R>.txt``;
* as a function entrypoint of ``launch_local`` (:func:`launch_probe`, the ``launch_*`` variants);
* ``python startup_probe.py --import-only OUT_DIR``: one process that imports ``torch.distributed``
  and stamps the time, the floor every worker pays (the ``import_torch`` variant).

torch is imported inside the functions: whoever imports this module to launch the probe (a parent
that forks its workers) has not imported torch itself.
"""

import gc
import os
import sys
import time


def probe(out_dir: str) -> None:
    """One rank: a gloo group, one DDP step of a ``Linear(8, 2)`` (the gradient all-reduce and the
    first ``optimizer.step()`` included), then this rank's stamp in ``out_dir``."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(4, 8)).sum().backward()  # the gradient all-reduce
    optimizer.step()
    stamp = time.time()
    rank = dist.get_rank()
    dist.destroy_process_group()
    gc.collect()  # torch 2.14's gloo can abort at exit otherwise (see shoal.distributed.process_group)
    _stamp(out_dir, rank, stamp)


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
    else:
        probe(sys.argv[1])
