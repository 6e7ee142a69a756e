"""``import horovod.keras as hvd`` is ``import shoal.horovod.keras as hvd`` (opted in: :mod:`shoal.horovod.shim`)."""

import sys

import shoal.horovod.keras

sys.modules[__name__] = shoal.horovod.keras
