"""``horovod.tensorflow.util`` as shoal.horovod's (opted in: :mod:`shoal.horovod.shim`)."""

from shoal.horovod.tensorflow.util import *  # noqa: F403
from shoal.horovod.tensorflow.util import __all__  # noqa: F401
