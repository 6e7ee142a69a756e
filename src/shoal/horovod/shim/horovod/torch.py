"""``import horovod.torch as hvd`` is ``import shoal.horovod as hvd`` (opted in: :mod:`shoal.horovod.shim`)."""

import sys

import shoal.horovod

sys.modules[__name__] = shoal.horovod
