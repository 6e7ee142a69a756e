"""``import horovod.tensorflow.keras as hvd`` is ``import shoal.horovod.tensorflow.keras as hvd`` (opted in: :mod:`shoal.horovod.shim`)."""

import sys

import shoal.horovod.tensorflow.keras

sys.modules[__name__] = shoal.horovod.tensorflow.keras
