"""shoal.horovod.tensorflow's collectives, errors, tape, Keras optimizer and callbacks on each rank; results to JSON.

Usage: hvd_tf_api.py OUT_DIR   (2 ranks under any launcher; writes OUT_DIR/rank{r}.json).
Each collective runs eagerly, inside tf.function, and in TF1 graph mode where Horovod's tests do.
The Keras fits compare with one process on the global batch, computed here on each rank with a
plain (not distributed) optimizer from the same initial weights.
"""

import hashlib
import json
import os
import sys
import warnings

import keras
import numpy as np
import tensorflow as tf
import torch

import shoal.horovod.keras
import shoal.horovod.tensorflow as hvd
import shoal.horovod.tensorflow.keras as hvdk
from shoal.horovod.tensorflow import bridge


def caught(call) -> str:
    """The error's class names and message (the calls below are expected to fail)."""
    try:
        call()
    except Exception as err:
        return ",".join(c.__name__ for c in type(err).__mro__[:-2]) + ": " + str(err).splitlines()[0]
    return "no error"


def ways(fn, *args):
    """fn(*args) eagerly, inside tf.function, and in a TF1 graph with a Session: three lists."""
    eager = fn(*args)
    traced = tf.function(fn)(*args)
    with tf.Graph().as_default():
        graph_out = fn(*[tf.constant(a) for a in args])
        with tf.compat.v1.Session() as session:
            graphed = session.run(graph_out)
    return [np.asarray(eager).tolist(), np.asarray(traced).tolist(), np.asarray(graphed).tolist()]


def digest(weights) -> str:
    return hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in weights)).hexdigest()


out: dict = {}
hvd.init()
r, n = hvd.rank(), hvd.size()
out["rank"] = r
value = np.array([r + 1.0, 10.0 * (r + 1)], dtype=np.float32)

# ---- collectives, three ways ------------------------------------------------------------------
out["allreduce"] = ways(lambda x: hvd.allreduce(x), value)
out["allreduce_sum_scaled"] = ways(
    lambda x: hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5), value
)
out["allreduce_max"] = ways(lambda x: hvd.allreduce(x, op=hvd.Max), value)
out["allreduce_int"] = ways(lambda x: hvd.allreduce(x, op=hvd.Average), np.array([r + 2], dtype=np.int32))
out["allreduce_fp16"] = hvd.allreduce(value, compression=hvd.Compression.fp16).numpy().tolist()
out["allgather"] = ways(lambda x: hvd.allgather(x), np.full((r + 1, 2), float(r), dtype=np.float32))
out["broadcast"] = ways(lambda x: hvd.broadcast(x, root_rank=1), value)
out["grouped_allreduce"] = [t.numpy().tolist() for t in hvd.grouped_allreduce([value, value * 2], op=hvd.Sum)]
out["grouped_allgather"] = [t.numpy().tolist() for t in hvd.grouped_allgather([value[None], value[None] * 2])]
received, splits = hvd.alltoall(tf.constant([[r, 0.0], [r, 1.0], [r, 2.0]]), splits=[1, 2])
out["alltoall"] = [received.numpy().tolist(), splits.numpy().tolist()]
out["reducescatter"] = hvd.reducescatter(tf.constant([[r + 1.0], [r + 2.0], [r + 3.0]]), op=hvd.Sum).numpy().tolist()
sparse = tf.IndexedSlices(tf.constant([[r + 1.0, 1.0]]), tf.constant([r]), tf.constant([2, 2]))
reduced_sparse = hvd.allreduce(sparse)
out["indexed_slices"] = [reduced_sparse.values.numpy().tolist(), reduced_sparse.indices.numpy().tolist()]
out["keras_allreduce"] = hvdk.allreduce(float(r), op=hvd.Sum).numpy().tolist()
out["broadcast_object"] = hvd.broadcast_object({"from": r}, root_rank=1)
out["allgather_object"] = hvd.allgather_object(r * 10)

# gradients flow through the collectives (Horovod's registered gradients)
x = tf.Variable([1.0, 2.0])
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(hvd.allreduce(x * (r + 1.0), op=hvd.Sum))
out["allreduce_grad"] = tape.gradient(loss, x).numpy().tolist()
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(hvd.allgather(x[None] * (r + 1.0)))
out["allgather_grad"] = tape.gradient(loss, x).numpy().tolist()

# broadcast_variables, DistributedGradientTape (eager and tf.function)
v = tf.Variable([float(r), float(r)])
hvd.broadcast_variables([v], root_rank=1)
out["broadcast_variables"] = v.numpy().tolist()
w = tf.Variable([1.0, 1.0])


def tape_grads(scale):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * scale)
    return hvd.DistributedGradientTape(tape).gradient(loss, [w])[0]


out["tape"] = [
    tape_grads(float(r + 1)).numpy().tolist(),
    tf.function(tape_grads)(tf.constant(float(r + 1))).numpy().tolist(),
]

# ---- Horovod's graph mode: independent collectives in one Session.run, named ops, dtypes ------
with tf.Graph().as_default():
    dtypes = (tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16, tf.float64)
    fused = [hvd.allreduce(tf.cast(tf.fill([3], r + 1), d), op=hvd.Sum) for d in dtypes]  # any order per rank
    wide = hvd.allgather(tf.fill([r + 1], tf.constant(60000 + r, tf.uint16)))  # uint16: gloo has none
    shape_ops = [hvd.rank_op(), hvd.size_op(), hvd.local_rank_op(), hvd.local_size_op()]
    bad = hvd.allreduce(tf.zeros([2 + r]), name="grad.w")
    with tf.compat.v1.Session() as session:
        out["graph_fused"] = [a.tolist() for a in session.run(fused)]
        out["graph_uint16"] = session.run(wide).tolist()
        out["named_ops"] = [int(v) for v in session.run(shape_ops)]
        try:
            session.run(bad)
        except Exception as err:  # TF's text: "Graph execution error: ... Could not find variable <shoal's line>"
            out["graph_mismatch"] = f"{type(err).__name__}: {err}"
sparse_grouped = hvd.grouped_allreduce([sparse, value], op=hvd.Sum)
out["grouped_indexed_slices"] = [
    sparse_grouped[0].values.numpy().tolist(),
    sparse_grouped[0].indices.numpy().tolist(),
    sparse_grouped[1].numpy().tolist(),
]
out["indexed_slices_max"] = caught(lambda: hvd.grouped_allreduce([sparse], op=hvd.Max))
out["indexed_slices_scaled"] = caught(lambda: hvd.allreduce(sparse, prescale_factor=2.0))
out["splits_error"] = caught(lambda: hvd.alltoall(tf.ones([n - 1])))
inplace = tf.Variable([float(r), 2.0 * r])
out["broadcast_inplace"] = [hvd.broadcast_([inplace], root_rank=1)[0].numpy().tolist(), inplace.numpy().tolist()]
# SyncBatchNormalization: rank r normalises its rows with the statistics of both ranks' rows
batch = np.array([[1.0, 2.0], [3.0, 5.0], [4.0, 9.0], [6.0, 0.0]], dtype=np.float32)
sync_bn = hvd.SyncBatchNormalization(axis=1, momentum=0.5)
plain_bn = keras.layers.BatchNormalization(axis=1, momentum=0.5)
mine = sync_bn(batch[2 * r : 2 * r + 2], training=True).numpy()
whole = plain_bn(batch, training=True).numpy()
out["sync_bn"] = [
    float(np.abs(mine - whole[2 * r : 2 * r + 2]).max()),
    float(np.abs(sync_bn.moving_variance.numpy() - plain_bn.moving_variance.numpy()).max()),
]
# elastic state: sync takes rank 0's, restore goes back to the last commit
tracked = tf.Variable([1.0 + r, 2.0])
elastic_state = hvd.elastic.TensorFlowState([tracked], batch=20 + r)
elastic_state.sync()
seen_sync = [tracked.numpy().tolist(), elastic_state.batch]
tracked.assign([5.0, 5.0])
elastic_state.batch = 21
elastic_state.restore()
seen_restore = [tracked.numpy().tolist(), elastic_state.batch]
tracked.assign([7.0, 7.0])
elastic_state.batch = 22
elastic_state.commit()
tracked.assign([0.0, 0.0])
elastic_state.restore()
out["elastic_state"] = [seen_sync, seen_restore, [tracked.numpy().tolist(), elastic_state.batch]]

# ---- the bridge: shared where safe, copied where not, never aborting --------------------------
source = tf.constant(np.arange(1024, dtype=np.float32))
view = bridge.to_torch(source)
out["tf_to_torch_shares"] = view.data_ptr() == torch.from_dlpack(source).data_ptr()
base = torch.arange(64, dtype=torch.float32)
unaligned = base[1:17]  # 4 bytes past a 64-byte boundary: TF would abort on a view of it
strided = base[::2]
out["unaligned_copied"] = [not bridge.can_share(unaligned), (tf.reduce_sum(bridge.to_tf(unaligned)) * 1).numpy().item()]
out["strided_copied"] = [not bridge.can_share(strided), tf.reduce_sum(bridge.to_tf(strided)).numpy().item()]
aligned = torch.arange(16, dtype=torch.float32)
out["aligned_shared"] = bridge.can_share(aligned) and bool(bridge.to_tf(aligned).numpy()[3] == 3.0)

# ---- errors: one line, the same on every rank, no hang -----------------------------------------
out["mismatch_eager"] = caught(lambda: hvd.allreduce(tf.zeros([2 + r]), name="grad.w"))
out["mismatch_dtype"] = caught(lambda: hvd.allreduce(tf.zeros([2], dtype=tf.float32 if r == 0 else tf.float64)))


@tf.function
def ragged_gather():
    return hvd.allgather(tf.zeros([1, 2 + r]))


out["mismatch_traced"] = caught(ragged_gather)
out["process_set"] = caught(lambda: hvd.allreduce(value, process_set=object()))
out["elastic"] = caught(lambda: hvd.elastic.run)
out["adasum"] = caught(lambda: hvd.allreduce(value, op=hvd.Adasum))
out["not_keras"] = caught(lambda: hvdk.DistributedOptimizer("sgd"))
out["eager_global_variables"] = caught(lambda: hvd.broadcast_global_variables(0))
out["missing_name"] = caught(lambda: hvd.PartialDistributedGradientTape)
out["keras_alias"] = (
    shoal.horovod.keras.DistributedOptimizer is hvdk.DistributedOptimizer
    and shoal.horovod.keras.callbacks is hvdk.callbacks
)
out["bad_root"] = caught(lambda: hvd.broadcast(value, root_rank=n))
out["after_errors"] = hvd.allreduce(tf.constant([1.0]), op=hvd.Sum).numpy().tolist()  # the job goes on

# ---- Keras fit: 2 ranks vs one process on the global batch -------------------------------------
rng = np.random.default_rng(0)
features = rng.normal(size=(32, 6)).astype(np.float32)
labels = (features @ rng.normal(size=(6, 3))).astype(np.float32)


def model_from(weights=None):
    keras.utils.set_random_seed(r)  # different initial weights per rank: the broadcast must fix them
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)])
    if weights is not None:
        model.set_weights(weights)
    return model


def fit(distributed: bool, jit=False, passes=1, compression=hvd.Compression.none, epochs=3):
    model = model_from()
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    if distributed:
        optimizer = hvdk.DistributedOptimizer(optimizer, backward_passes_per_step=passes, compression=compression)
    model.compile(optimizer=optimizer, loss="mse", jit_compile=jit)
    # rank r's shard of every global batch of 8: rows r, r + 2, ... of each batch (dataset.shard)
    shard = tf.data.Dataset.from_tensor_slices((features, labels)).shard(n, r).batch(8 // n)
    callbacks = [hvdk.callbacks.BroadcastGlobalVariablesCallback(0), hvdk.callbacks.MetricAverageCallback()]
    history = model.fit(shard, epochs=epochs, verbose=0, callbacks=callbacks)
    return model, history.history["loss"]


def reference(initial, lr=0.05, passes=1, epochs=3):
    """One process on the global batch (the two shards' rows), from rank 0's initial weights."""
    model = model_from(initial)
    model.compile(
        optimizer=keras.optimizers.SGD(lr, momentum=0.9, gradient_accumulation_steps=passes if passes > 1 else None),
        loss="mse",
    )
    order = np.concatenate([np.arange(b * 8, b * 8 + 8).reshape(-1, n).T.reshape(-1) for b in range(4)])
    model.fit(features[order], labels[order], batch_size=8, epochs=epochs, shuffle=False, verbose=0)
    return model.get_weights()


initial = hvd.broadcast_object(model_from().get_weights(), root_rank=0)
model, losses = fit(True)
out["fit_digest"] = digest(model.get_weights())
out["fit_vs_one_process"] = max(float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), reference(initial)))
out["fit_losses"] = losses
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    jit_model, _ = fit(True, jit=True, epochs=1)
out["jit_warning"] = [str(w.message) for w in seen if "jit_compile" in str(w.message)]
out["jit_digest"] = digest(jit_model.get_weights())
model, _ = fit(True, passes=2, epochs=2)
out["passes2_digest"] = digest(model.get_weights())
# Horovod sums the 2 local passes (average_aggregated_gradients=False): 2x Keras's accumulated mean
out["passes2_vs_one_process"] = max(
    float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), reference(initial, lr=0.1, passes=2, epochs=2))
)
model, _ = fit(True, compression=hvd.Compression.fp16, epochs=1)
out["fp16_digest"] = digest(model.get_weights())

# learning-rate callbacks: warm-up from lr/size to lr over 2 epochs, per batch
model = model_from()
model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.2)), loss="mse")
rates = []
record = keras.callbacks.LambdaCallback(
    on_batch_begin=lambda b, logs: rates.append(float(model.optimizer.learning_rate.numpy()))
)
warmup = hvdk.callbacks.LearningRateWarmupCallback(initial_lr=0.2, warmup_epochs=2)
schedule = hvdk.callbacks.LearningRateScheduleCallback(initial_lr=0.2, multiplier=0.5, start_epoch=2)
shard = tf.data.Dataset.from_tensor_slices((features, labels)).shard(n, r).batch(8 // n)
model.fit(shard, epochs=3, verbose=0, callbacks=[warmup, schedule, record])
out["lr"] = rates

with open(os.path.join(sys.argv[1], f"rank{r}.json"), "w") as f:
    json.dump(out, f)

# Last: a mismatch inside tf.function that nobody catches. tf.py_function re-raises it as a TF
# error; the process must still end with shoal's one line and HINT on every rank, no traceback.
print(f"rank {r}: results written", flush=True)
ragged_gather()
