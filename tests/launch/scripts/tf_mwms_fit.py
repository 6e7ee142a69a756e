"""A tiny Keras ``fit`` under ``tf.distribute.MultiWorkerMirroredStrategy``, from the TF_CONFIG the
launcher gave. Writes ``OUT_DIR/worker<index>.json``: the workers the strategy saw and the final
weights. Usage: ``tf_mwms_fit.py OUT_DIR``. Imports TensorFlow, never torch."""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
# Keras 3.15's fit fails under this strategy with more than one worker (keras-team/keras#20585,
# tensorflow/tensorflow#72388, open): it reduces a whole (x, y) batch in one strategy.reduce call,
# and scalar losses with axis=0. Reduce each tensor alone, scalars without an axis.
_reduce = strategy.reduce


def _reduce_each(op, value, axis=None):
    def one(v):
        rank = (v.values[0] if isinstance(v, tf.distribute.DistributedValues) else tf.convert_to_tensor(v)).shape.rank
        return _reduce(op, v, axis=axis if rank else None)

    return tf.nest.map_structure(one, value)


strategy.reduce = _reduce_each
keras.utils.set_random_seed(0)
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")

rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")).astype("float32")
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).with_options(options)
history = model.fit(data, epochs=3, shuffle=False, verbose=0)

index = strategy.cluster_resolver.task_id
result = {
    "index": index,
    "replicas": strategy.num_replicas_in_sync,
    "workers": strategy.cluster_resolver.cluster_spec().as_dict()["worker"],
    "loss": history.history["loss"],
    "weights": [w.tolist() for w in model.get_weights()],
}
with open(os.path.join(sys.argv[1], f"worker{index}.json"), "w") as f:
    json.dump(result, f)
