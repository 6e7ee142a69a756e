"""``horovod.tensorflow.util``'s public helper (Horovod 0.28): whether TensorFlow runs eagerly here."""

from shoal.horovod.tensorflow.graph import executing_eagerly as _executing_eagerly

__all__ = ["_executing_eagerly"]
