"""Horovod's TensorFlow 2 and Keras 3 API on the torch engine; users import :mod:`shoal.horovod.tensorflow`.

The modules, by concept:

- :mod:`~.framework`: TensorFlow itself (one line and a HINT when it is missing).
- :mod:`~.bridge`: TF tensors to torch and back by DLPack, copied where sharing is unsafe.
- :mod:`~.graph`: a torch-side collective run eagerly, or as a ``tf.py_function`` in graphs.
- :mod:`~.collectives`: ``allreduce``, ``allgather``, ``broadcast``, ``alltoall``, ``reducescatter``
  and their grouped forms, with Horovod's gradients.
- :mod:`~.variables`: ``broadcast_variables``, ``broadcast_object``, ``allgather_object``.
- :mod:`~.compression`: ``Compression.none`` / ``Compression.fp16`` on TF tensors.
- :mod:`~.reduce`: one step's gradients fused and all-reduced (the optimizer's and the tape's core).
- :mod:`~.optimizer`: ``DistributedOptimizer`` for Keras 3 optimizers.
- :mod:`~.tape`: ``DistributedGradientTape``.
- :mod:`~.callbacks`: Horovod's Keras callbacks.
- :mod:`~.saving`: ``load_model``.
"""

# Imported first, before any submodule imports keras: without TensorFlow, one line and a HINT.
from shoal.integrations.horovod.tensorflow import framework as _framework  # noqa: F401
