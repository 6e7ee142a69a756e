"""The Tanzu lab's Horovod + Keras script on today's TensorFlow: MobileNetV2, the seven steps, shoal's engine.

The NVIDIA AI Enterprise lab "Multi-Node Training with Tanzu" trains a Keras MobileNet with
``horovod.tensorflow.keras`` under the MPI operator. Horovod 0.28.1 fails on Keras 3
(horovod/horovod#4290); this is the lab's script with one line changed (the import), running on
shoal.horovod's torch.distributed engine. The images are made here (no download): each class a
colour, plus noise, so the run needs no data and shows learning in a few epochs.

::

    mpirun -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 python examples/horovod_keras_mobilenet.py
    shoal launch --hosts node1:1,node2:1 -- examples/horovod_keras_mobilenet.py --out /shared/run
    shoal run --nproc 2 examples/horovod_keras_mobilenet.py

``--report DIR`` writes each rank's view of the run (rank, final weights' digest, metrics,
checkpoints it wrote) to ``DIR/rank<r>.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os

import keras
import numpy as np
import tensorflow as tf

import shoal.horovod.tensorflow.keras as hvd  # was: import horovod.tensorflow.keras as hvd


def make_images(count: int, size: int, classes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``count`` images of ``size`` x ``size`` pixels: class c is a fixed colour plus noise (the same on every rank)."""
    rng = np.random.default_rng(seed)
    colours = rng.uniform(-1.0, 1.0, size=(classes, 1, 1, 3))
    labels = rng.integers(0, classes, size=count)
    images = colours[labels] + rng.normal(0.0, 0.5, size=(count, size, size, 3))
    return images.astype(np.float32), labels.astype(np.int64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8, help="per rank")
    parser.add_argument("--lr", type=float, default=0.01, help="per rank: scaled by hvd.size()")
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--alpha", type=float, default=0.35, help="MobileNetV2's width multiplier")
    parser.add_argument("--out", default="mobilenet-run", help="rank 0's checkpoints go here")
    parser.add_argument("--report", default=None, help="write each rank's view of the run to DIR/rank<r>.json")
    args = parser.parse_args()

    # 1. Initialise Horovod.
    hvd.init()

    # 2. Pin one GPU per process (nothing to do on CPU).
    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

    # 4. Each rank trains on its shard of the data.
    images, labels = make_images(args.images, args.image_size, args.classes)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).shard(hvd.size(), hvd.rank()).batch(args.batch_size)
    keras.utils.set_random_seed(hvd.rank())  # different initial weights per rank: step 6 makes them one
    model = keras.applications.MobileNetV2(
        input_shape=(args.image_size, args.image_size, 3), alpha=args.alpha, weights=None, classes=args.classes
    )

    # 3. Scale the learning rate by the number of processes.
    scaled_lr = args.lr * hvd.size()
    optimizer = keras.optimizers.SGD(learning_rate=scaled_lr, momentum=0.9)

    # 5. Wrap the optimizer: every rank's gradients are averaged before each update.
    optimizer = hvd.DistributedOptimizer(optimizer)
    model.compile(loss="sparse_categorical_crossentropy", optimizer=optimizer, metrics=["accuracy"])

    # 6. Start every rank from rank 0's weights; average the metrics; warm the learning rate up.
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=1, verbose=1),
    ]

    # 7. Checkpoints on rank 0 only, so that the workers do not overwrite them.
    checkpoints = []
    if hvd.rank() == 0:
        os.makedirs(args.out, exist_ok=True)
        pattern = os.path.join(args.out, "checkpoint-{epoch}.keras")
        callbacks.append(keras.callbacks.ModelCheckpoint(pattern))
        checkpoints = [pattern.format(epoch=epoch + 1) for epoch in range(args.epochs)]

    history = model.fit(dataset, epochs=args.epochs, callbacks=callbacks, verbose=2 if hvd.rank() == 0 else 0)

    if args.report:
        write_report(args.report, model, history, checkpoints)


def digest(weights: list) -> str:
    return hashlib.sha256(b"".join(np.ascontiguousarray(w.numpy()).tobytes() for w in weights)).hexdigest()


def write_report(directory: str, model: keras.Model, history: keras.callbacks.History, checkpoints: list[str]) -> None:
    """This rank's view of the run; rank 0 also reloads its last checkpoint with ``hvd.load_model``."""
    report = {
        "rank": hvd.rank(),
        "size": hvd.size(),
        "module": hvd.__name__,
        "trainable_digest": digest(model.trainable_weights),
        "history": {name: [float(v) for v in values] for name, values in history.history.items()},
        "lr": float(model.optimizer.learning_rate.numpy()),
        "checkpoints": checkpoints,
    }
    if checkpoints:
        restored = hvd.load_model(checkpoints[-1])  # its optimizer, state included, distributed again
        report["checkpoint_digest"] = digest(restored.trainable_weights)
        report["restored_optimizer"] = [type(restored.optimizer).__name__, int(restored.optimizer.iterations.numpy())]
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"rank{hvd.rank()}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
