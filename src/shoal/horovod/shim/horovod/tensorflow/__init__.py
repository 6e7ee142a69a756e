"""``import horovod.tensorflow as hvd`` is ``import shoal.horovod.tensorflow as hvd`` (opted in: :mod:`shoal.horovod.shim`).

A package of its own (not the shoal module swapped in), so that ``horovod.tensorflow.keras`` is
found here too.
"""

from shoal.horovod.tensorflow import *  # noqa: F403
from shoal.horovod.tensorflow import __all__, __getattr__  # noqa: F401
