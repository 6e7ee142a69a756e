"""``horovod`` as shoal.horovod, for unchanged ``import horovod...`` lines (opted in: :mod:`shoal.horovod.shim`).

A real Horovod elsewhere on ``sys.path`` wins: this module then loads it in its own place, so that
``import horovod.torch`` and the rest are Horovod's own.
"""

import importlib.machinery
import importlib.util
import os
import sys
import warnings

__version__ = "0.28.1"
"""The Horovod release whose API shoal.horovod follows."""

_SHIM_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _real_horovod():
    others = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != _SHIM_DIR]
    return importlib.machinery.PathFinder.find_spec("horovod", others)


_spec = _real_horovod()
if _spec is not None and _spec.loader is not None:
    warnings.warn(
        f"shoal.horovod.shim: a real Horovod is installed ({_spec.origin}); using it, not shoal's",
        stacklevel=2,
    )
    _real = importlib.util.module_from_spec(_spec)
    sys.modules[__name__] = _real
    _spec.loader.exec_module(_real)
