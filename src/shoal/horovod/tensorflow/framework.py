"""TensorFlow itself: imported once here, with one line and a HINT when it is missing.

The TF front of shoal.horovod needs TensorFlow 2 (tested with 2.21) and Keras 3; both come with
``pip install 'shoal[tensorflow]'``. TensorFlow and torchft in one process crash it (measured), so
nothing here imports torchft.
"""

from __future__ import annotations

from typing import Any

from shoal.errors import ShoalError


def require_tensorflow() -> Any:
    """The ``tensorflow`` module, or a ShoalError naming the extra to install."""
    try:
        import tensorflow as tf
    except ImportError as error:
        raise ShoalError(
            f"shoal.horovod.tensorflow needs TensorFlow, which is not installed here ({error})",
            hint="pip install 'shoal[tensorflow]'",
        ) from None
    return tf


tf = require_tensorflow()
