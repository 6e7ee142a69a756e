"""The opt-in for scripts that keep ``import horovod.torch`` / ``horovod.tensorflow[.keras]`` / ``horovod.keras``.

This directory holds a package named ``horovod`` whose modules are shoal.horovod's. It is on no
path by default; a user opts in by putting it first on ``PYTHONPATH`` (``python -m
shoal.horovod.shim`` prints it)::

    export PYTHONPATH="$(python -m shoal.horovod.shim)${PYTHONPATH:+:$PYTHONPATH}"
    mpirun -np 2 -x PYTHONPATH -x MASTER_ADDR=node1 -x MASTER_PORT=29500 python train.py

It never shadows a real Horovod: when another ``horovod`` package is importable from the rest of
``sys.path``, ``import horovod`` loads that one instead (one warning says so).
"""

from __future__ import annotations

import os


def path() -> str:
    """The directory to put on PYTHONPATH: it holds the ``horovod`` package."""
    return os.path.dirname(os.path.abspath(__file__))
