"""What a worker's Python loads before the user's script, on the paths where shoal starts the
script's interpreter itself (``shoal run``'s workers through :mod:`shoal.launch.worker_shim`, each
mpirun or srun rank through :func:`shoal.launch.as_torchrun.environment_for`): :func:`add_exit_hook` puts this
directory first on its ``PYTHONPATH``, and ``site`` imports its ``sitecustomize.py``, which leaves a
gloo process group still open at exit (see
:func:`shoal.launch.exit_hook.sitecustomize.leave_gloo_group`). :func:`add_horovod_shim` puts the
Horovod shim there too when asked (``SHOAL_HOROVOD_SHIM=1``). Only the standard library here (and
shoal's error type for a bad value)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, MutableMapping

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


HOROVOD_SHIM_ENV = "SHOAL_HOROVOD_SHIM"
"""``1`` (``shoal run --horovod-shim``, ``shoal launch ... --horovod-shim``): the worker's Python gets
Horovod's module names (``import horovod.tensorflow.keras`` loads shoal.horovod's), resolved on the
worker, wherever shoal is installed there."""
HOROVOD_SHIM_DIRECTORY = os.path.join(os.path.dirname(os.path.dirname(DIRECTORY)), "horovod", "shim")
"""The directory holding the ``horovod`` package of :mod:`shoal.horovod.shim` (its ``path()``), found
beside this package: launch never imports the facade above it."""

_ON = ("1", "on", "true", "yes")
_OFF = ("", "0", "off", "false", "no")


def switch(environ: Mapping[str, str], name: str, hint: str) -> bool:
    """Whether the variable ``name`` of ``environ`` is on (``1``, ``on``, ``true``, ``yes``) or off
    (unset, empty, ``0``, ``off``, ``false``, ``no``); any other value is a ShoalError with ``hint``."""
    value = environ.get(name, "").strip()
    if value.lower() in _OFF:
        return False
    if value.lower() in _ON:
        return True
    from shoal.errors import ShoalError

    raise ShoalError(f"{name}={value}: neither on nor off", hint)


def add_horovod_shim(environ: MutableMapping[str, str]) -> None:
    """With ``SHOAL_HOROVOD_SHIM=1`` in ``environ`` (the worker's, before ``exec``), put this
    installation's Horovod shim first on its ``PYTHONPATH`` (once); the variable itself is removed.
    Before :func:`add_exit_hook`, so the script and whatever it starts keep the shim on their path."""
    hint = f"set {HOROVOD_SHIM_ENV}=1 (or pass --horovod-shim) for Horovod's module names; 0 or unset for none"
    on = switch(environ, HOROVOD_SHIM_ENV, hint)
    environ.pop(HOROVOD_SHIM_ENV, None)
    if not on:
        return
    original = environ.get("PYTHONPATH")
    entries = original.split(os.pathsep) if original else []
    if HOROVOD_SHIM_DIRECTORY not in entries:
        environ["PYTHONPATH"] = os.pathsep.join([HOROVOD_SHIM_DIRECTORY, *entries])
