"""What a worker's Python loads before the user's script, on the paths where shoal starts the
script's interpreter itself (``shoal run``'s workers through :mod:`shoal.launch.worker_shim`, each
mpirun or srun rank through :func:`shoal.launch.as_torchrun.environment_for`): :func:`add_exit_hook` puts this
directory first on its ``PYTHONPATH``, and ``site`` imports its ``sitecustomize.py``, which leaves a
gloo process group still open at exit (see
:func:`shoal.launch.exit_hook.sitecustomize.leave_gloo_group`). Only the standard library here."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import MutableMapping

DIRECTORY = os.path.dirname(os.path.abspath(__file__))
ORIGINAL_PATH_ENV = "SHOAL_ORIGINAL_PYTHONPATH"
"""The worker's own ``PYTHONPATH`` (``"-"`` when it had none), restored by ``sitecustomize`` before
the script runs, so the script and whatever it starts see the environment they were given."""
EXIT_HOOK_ENV = "SHOAL_EXIT_HOOK"
"""``0`` (or off/false/no) in the launcher's environment: workers start without the hook."""


def add_exit_hook(environ: MutableMapping[str, str], program: str) -> None:
    """Put this directory first on ``PYTHONPATH`` in ``environ`` (the worker's, before ``exec``)
    when ``program`` is this Python and ``SHOAL_EXIT_HOOK`` does not turn it off; the variable
    itself is removed either way."""
    wanted = environ.pop(EXIT_HOOK_ENV, "1").strip().lower() not in ("0", "off", "false", "no")
    found = shutil.which(program, path=environ.get("PATH")) or program
    if not wanted or os.path.realpath(found) != os.path.realpath(sys.executable):
        return
    original = environ.get("PYTHONPATH")
    environ[ORIGINAL_PATH_ENV] = "-" if original is None else original
    environ["PYTHONPATH"] = DIRECTORY if not original else DIRECTORY + os.pathsep + original
