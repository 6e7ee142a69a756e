"""``load_model``: a saved Keras model with its optimizer distributed (Horovod's ``hvd.load_model``)."""

from __future__ import annotations

from typing import Any

import keras

from shoal.horovod.tensorflow.compression import Compression
from shoal.horovod.tensorflow.optimizer import DistributedOptimizer


def load_model(filepath: Any, custom_optimizers: Any = None, custom_objects: Any = None,
               compression: Any = Compression.none) -> Any:  # fmt: skip
    """``keras.models.load_model(filepath)`` whose optimizer (state included) is wrapped by
    :func:`DistributedOptimizer`; ``custom_optimizers`` are optimizer classes the file names."""
    objects = dict(custom_objects or {})
    objects.update({cls.__name__: cls for cls in custom_optimizers or []})
    model = keras.models.load_model(filepath, custom_objects=objects or None)
    if getattr(model, "optimizer", None) is not None:
        DistributedOptimizer(model.optimizer, compression=compression)
    return model
