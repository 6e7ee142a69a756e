"""Loaded by a ``shoal run`` worker's Python before the user's script (``site`` imports the first
``sitecustomize`` on ``sys.path``; the worker shim puts this directory first on ``PYTHONPATH``).

1. Registers :func:`leave_gloo_group` at exit.
2. Restores the worker's own ``PYTHONPATH`` and ``sys.path`` (this directory leaves both), then
   imports the ``sitecustomize`` this one shadowed, if any (a distribution's or a virtual
   environment's), as ``site`` would have.

Only the standard library here: it runs in every worker, before anything else.
"""

import atexit
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_ORIGINAL_PATH_ENV = "SHOAL_ORIGINAL_PYTHONPATH"  # shoal.launch.exit_hook.ORIGINAL_PATH_ENV
_SETTLE_S = 0.25
"""At exit of a rank of a job of several, after the collection: the GIL free for this long."""


def leave_gloo_group() -> None:
    """At exit, leave a gloo default process group the script left open, then collect garbage
    (whenever ``torch.distributed`` was imported).

    torch's gloo threads release a finished collective's tensors a moment after it returns, which
    needs the GIL; when the interpreter is already shutting down, the thread dies mid-C++ and the
    worker ends with SIGABRT ("terminate called without an active exception") after all its work:
    about 1 run in 8 of a two-rank DDP script that never calls ``destroy_process_group`` (Lightning's
    ``Trainer.fit`` is one), and as often after ``destroy_process_group()`` alone (21 of 175 runs);
    none of 180 with a collection right after it. ``atexit`` runs while the interpreter is whole;
    see :func:`shoal.distributed.process_group.destroy_process_group` and docs/BENCHMARKS.md. NCCL
    groups are not destroyed here (their destruction may wait on peers that already left).
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    try:
        if dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo":
            dist.destroy_process_group()
    except Exception:  # never turn a finished script into a failed one
        return
    import gc

    gc.collect()  # also after a script's own destroy_process_group(): that alone did not help
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        # The GIL released for a moment, while the interpreter is whole: a gloo thread still holding
        # a finished collective's tensors (its group kept alive by the script: Accelerate's state,
        # a DDP model) releases them now. Added for an Accelerate abort under mpirun that later
        # proved to be on a path without this hook (shoal.jobs.hosts.rank_status, since fixed);
        # kept as a cheap guard (about 0.1-0.3 s a launch), its own effect not measured.
        time.sleep(_SETTLE_S)


def record_uncaught(exc_type, exc_value, exc_traceback) -> None:
    """``sys.excepthook`` of a worker whose agent named an error file: the traceback goes there,
    in the format of torch's ``@record`` (torch/distributed/elastic/multiprocessing/errors/
    error_handler.py, torch 2.14), instead of the console. The launcher then prints the first
    failure's traceback once, and summarises the ranks that failed because of it, rather than
    every rank's copy (torch's ``[rankN]:`` one included) interleaved on the terminal. With the
    launcher's ``--verbose`` (``SHOAL_WORKER_TRACEBACKS=1``) each worker prints its own too."""
    import json
    import traceback

    path = os.environ.get("TORCHELASTIC_ERROR_FILE", "")
    text = "".join(traceback.format_exception(exc_type, exc_value, exc_traceback))
    message = traceback.format_exception_only(exc_type, exc_value)[-1].strip()
    data = {"message": {"message": message, "extraInfo": {"py_callstack": text, "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "x") as f:  # "x": a script's own @record wrote it first, and said more
            json.dump(data, f)
    except FileExistsError:
        pass
    except OSError:
        sys.__excepthook__(exc_type, exc_value, exc_traceback)
        return
    if os.environ.get("SHOAL_WORKER_TRACEBACKS") == "1":
        sys.__excepthook__(exc_type, exc_value, exc_traceback)


def _restore_environment() -> None:
    original = os.environ.pop(_ORIGINAL_PATH_ENV, None)
    if original is not None:
        if original == "-":
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = original
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != _HERE]


def _chain() -> None:
    """Import the ``sitecustomize`` that this one shadows (``site`` would have imported it), its
    errors said as ``site`` says them."""
    this = sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401  (the next one on sys.path, now that this one left it)
    except ImportError as err:
        if this is not None:
            sys.modules["sitecustomize"] = this
        if err.name != "sitecustomize":
            _said(err)
    except Exception as err:
        _said(err)


def _said(err: BaseException) -> None:
    print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(err).__name__}: {err}", file=sys.stderr)


atexit.register(leave_gloo_group)
if os.environ.get("TORCHELASTIC_ERROR_FILE"):
    sys.excepthook = record_uncaught
_restore_environment()
_chain()
