"""Deprecated alias of :mod:`shoal.distributed` (and of :mod:`shoal.context` for ``shoal.dist.context``).

The package was renamed because Python tools treat a folder called ``dist`` as build output (ruff
and black skip it by default). Scripts that imported ``shoal.dist.*`` keep working, with a
``DeprecationWarning``; import from ``shoal`` (the public API) or ``shoal.distributed`` instead.
"""

import importlib
import sys
import warnings

warnings.warn(
    "shoal.dist is deprecated: use the names in shoal (e.g. shoal.init) or shoal.distributed",
    DeprecationWarning,
    stacklevel=2,
)

_RENAMED = {
    "collectives": "shoal.distributed.collectives",
    "comm_hooks": "shoal.distributed.comm_hooks",
    "device": "shoal.distributed.device",
    "wrap": "shoal.distributed.wrap",
    "context": "shoal.context",
}
for _old, _new in _RENAMED.items():
    sys.modules[f"{__name__}.{_old}"] = globals()[_old] = importlib.import_module(_new)
