"""Horovod's ``horovod.keras`` (Keras on TensorFlow): the same API as :mod:`shoal.horovod.tensorflow.keras`.

Keras 3 is one package whatever the backend, so ``import horovod.keras as hvd`` scripts get the
``horovod.tensorflow.keras`` API (``import shoal.horovod.keras as hvd``).
"""

from __future__ import annotations

from shoal.horovod.tensorflow.keras import *  # noqa: F403
from shoal.horovod.tensorflow.keras import __all__, __getattr__  # noqa: F401
