"""Keras ``fit`` step time on 2 CPU ranks: shoal.horovod.tensorflow.keras against MultiWorkerMirroredStrategy.

::

    python examples/horovod_keras_bench.py --steps 30

Both variants train the same model (the lab's MobileNetV2, ``weights=None``, 32x32 images made
here) on the same data, 2 worker processes on this machine, one thread each:

- ``horovod``: ``hvd.DistributedOptimizer`` + ``BroadcastGlobalVariablesCallback``, the gradients
  all-reduced by torch.distributed (gloo) through the DLPack bridge; the ranks get torchrun's
  variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) on loopback.
- ``mwms``: ``tf.distribute.MultiWorkerMirroredStrategy`` (TF's own collectives over gRPC), the
  workers given a ``TF_CONFIG`` built here on loopback, the global batch sharded by the strategy.

Each worker times every batch of ``fit`` (a callback); the first ``--warmup`` are dropped (tracing).
The horovod workers then time the gradient all-reduce alone, twice per step for ``--steps`` steps:
through the bridge (the TF gradients, as the optimizer does it) and the same all-reduce on torch
tensors of the same shapes (what shoal.horovod's torch optimizer does): the bridge's cost per step.
Prints one table of medians and the ratios.

``--against DIR`` instead times the ``horovod`` variant's step against itself with shoal imported
from ``DIR`` (a ``src`` directory, e.g. of a ``git worktree`` at an earlier commit), the two
alternating for ``--rounds`` rounds in one run: a change's cost per step, as a same-run ratio::

    git worktree add /tmp/before HEAD~1
    python examples/horovod_keras_bench.py --steps 30 --against /tmp/before/src --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORLD = 2


def _workers(variant: str, args: argparse.Namespace, out: str, src: str | None = None) -> None:
    """Start the 2 workers of ``variant`` and wait for them (their results go to ``out``); with
    ``src``, the workers import shoal from that directory."""
    from shoal.launch.ports import find_free_port

    ports = [find_free_port() for _ in range(WORLD)]
    procs = []
    for rank in range(WORLD):
        env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2")
        if src:
            env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
        if variant == "horovod":
            env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(ports[0]))  # fmt: skip
        else:
            cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
            env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": rank}})
        argv = [sys.executable, __file__, "--worker", variant, "--out", out, "--steps", str(args.steps),
                "--warmup", str(args.warmup), "--batch-size", str(args.batch_size)]  # fmt: skip
        procs.append(subprocess.Popen(argv, env=env))
    for proc in procs:
        if proc.wait(timeout=1200) != 0:
            raise SystemExit(f"a {variant} worker failed (exit {proc.returncode})")


def _data(count: int):
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.normal(size=(count, 32, 32, 3)).astype(np.float32), rng.integers(0, 10, size=count)


def _model():
    import keras

    return keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=10)


def _worker(variant: str, args: argparse.Namespace) -> None:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras

    keras.config.disable_traceback_filtering()
    steps = args.warmup + args.steps
    images, labels = _data(steps * args.batch_size * WORLD)
    times: list[float] = []

    class Timer(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter() - self.start)

    result: dict = {}
    if variant == "horovod":
        import shoal.horovod.tensorflow.keras as hvd

        hvd.init()
        rank = hvd.rank()
        dataset = tf.data.Dataset.from_tensor_slices((images, labels)).shard(WORLD, rank).batch(args.batch_size)
        model = _model()
        model.compile(
            optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="sparse_categorical_crossentropy"
        )
        model.fit(dataset, epochs=1, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Timer()])
        result["bridge"] = _bridge_cost(model, args.steps)
    else:
        strategy = _patched(tf.distribute.MultiWorkerMirroredStrategy())
        rank = strategy.cluster_resolver.task_id
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        dataset = (
            tf.data.Dataset.from_tensor_slices((images, labels)).batch(args.batch_size * WORLD).with_options(options)
        )
        with strategy.scope():
            model = _model()
            model.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy")
        model.fit(dataset, epochs=1, verbose=0, callbacks=[Timer()])
    result["step_s"] = statistics.median(times[args.warmup :])
    with open(os.path.join(args.out, f"{variant}-{rank}.json"), "w") as f:
        json.dump(result, f)


def _patched(strategy):
    """The strategy with Keras 3's multi-worker fit made to work (docs/LAUNCHERS.md, "Keras 3 and this strategy").

    Keras 3.15's fit reduces a whole (x, y) batch in one ``strategy.reduce`` and scalars with
    ``axis=0``, which fails with more than one worker (keras-team/keras#20585,
    tensorflow/tensorflow#72388, open): reduce each tensor alone, scalars without an axis.
    """
    import tensorflow as tf

    reduce = strategy.reduce

    def reduce_each(op, value, axis=None):
        def one(v):
            first = v.values[0] if isinstance(v, tf.distribute.DistributedValues) else tf.convert_to_tensor(v)
            return reduce(op, v, axis=axis if first.shape.rank else None)

        return tf.nest.map_structure(one, value)

    strategy.reduce = reduce_each
    return strategy


def _bridge_cost(model, steps: int) -> dict:
    """Median seconds of one step's gradient all-reduce: through the bridge, and on torch tensors."""
    import tensorflow as tf
    import torch

    from shoal.horovod import buckets
    from shoal.horovod import ops as engine
    from shoal.horovod.tensorflow.reduce import GradientSettings, reduce_gradients

    grads = [tf.random.normal(v.shape) for v in model.trainable_variables]
    settings = GradientSettings()
    tensors = [torch.randn(tuple(v.shape)) for v in model.trainable_variables]
    flat = torch.empty(buckets.total_numel(tensors))
    traced = tf.function(lambda: reduce_gradients(grads, settings))  # as inside model.fit
    traced()
    bridge, eager, plain = [], [], []
    for _ in range(steps):
        start = time.perf_counter()
        traced()
        bridge.append(time.perf_counter() - start)
        start = time.perf_counter()
        reduce_gradients(grads, settings)  # eagerly, as with DistributedGradientTape in a custom loop
        eager.append(time.perf_counter() - start)
        start = time.perf_counter()
        buckets.pack(tensors, flat)  # pack, reduce, copy back: the torch optimizer's work per bucket
        engine.start_reduce("bench", [flat], None, engine.ReduceOp.Average, 1.0, 1.0, agree=False).wait()
        buckets.unpack(flat, tensors)
        plain.append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in (("bridge_s", bridge), ("eager_s", eager), ("torch_s", plain))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=5, help="first steps not timed (tracing)")
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--variants", default="horovod,mwms", help=argparse.SUPPRESS)
    parser.add_argument("--worker", choices=["horovod", "mwms"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--against", metavar="DIR", help="time the horovod step against shoal imported from DIR")
    parser.add_argument("--rounds", type=int, default=3, help="with --against: alternating rounds")
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args)
        return
    if args.against:
        _against(args)
        return
    with tempfile.TemporaryDirectory() as out:
        for variant in args.variants.split(","):
            _workers(variant, args, out)
        found = {path.stem: json.loads(path.read_text()) for path in Path(out).glob("*.json")}
    hvd_step = max(found[f"horovod-{r}"]["step_s"] for r in range(WORLD))
    mwms_step = max(found[f"mwms-{r}"]["step_s"] for r in range(WORLD))
    bridge = max(found[f"horovod-{r}"]["bridge"]["bridge_s"] for r in range(WORLD))
    eager = max(found[f"horovod-{r}"]["bridge"]["eager_s"] for r in range(WORLD))
    plain = max(found[f"horovod-{r}"]["bridge"]["torch_s"] for r in range(WORLD))
    print(f"{'measure (2 ranks, median, slowest rank)':<58} {'seconds':>10}")
    print(f"{'Keras fit step, shoal.horovod.tensorflow.keras':<58} {hvd_step:>10.4f}")
    print(f"{'Keras fit step, MultiWorkerMirroredStrategy':<58} {mwms_step:>10.4f}")
    print(f"{'gradient all-reduce per step, TF via the bridge, in a graph':<58} {bridge:>10.5f}")
    print(f"{'gradient all-reduce per step, TF via the bridge, eagerly':<58} {eager:>10.5f}")
    print(f"{'the same all-reduce on torch tensors':<58} {plain:>10.5f}")
    print(f"ratio horovod / MWMS step: {hvd_step / mwms_step:.2f}; bridge / torch all-reduce: {bridge / plain:.2f} "
          f"(graph), {eager / plain:.2f} (eager); "
          f"bridge (graph) minus torch: {(bridge - plain) * 1e3:+.2f} ms per step of {hvd_step * 1e3:.0f} ms")  # fmt: skip


def _against(args: argparse.Namespace) -> None:
    """The horovod variant's step with shoal from ``args.against`` and from here, alternating."""
    steps: dict[str, list[float]] = {"baseline": [], "current": []}
    for _ in range(args.rounds):
        for label, src in (("baseline", args.against), ("current", None)):
            with tempfile.TemporaryDirectory() as out:
                _workers("horovod", args, out, src)
                found = [json.loads(p.read_text()) for p in Path(out).glob("horovod-*.json")]
            steps[label].append(max(r["step_s"] for r in found))
    base, current = statistics.median(steps["baseline"]), statistics.median(steps["current"])
    print(f"Keras fit step (median of {args.rounds} rounds, slowest rank): baseline {base:.4f} s "
          f"({', '.join(f'{t:.4f}' for t in steps['baseline'])}), current {current:.4f} s "
          f"({', '.join(f'{t:.4f}' for t in steps['current'])}); current / baseline {current / base:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
