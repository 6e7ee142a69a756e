"""Horovod's Keras callbacks (``horovod/_keras/callbacks.py``, Horovod 0.28) for Keras 3.

- :class:`BroadcastGlobalVariablesCallback`: root's model and optimizer variables to every rank when
  training begins. Keras 3 builds the optimizer's slots before the first batch (``fit``'s symbolic
  build), so unlike Horovod's (after the first batch) every rank starts the first step from the
  same weights, and the run equals one process on the global batch. Also turns off
  ``jit_compile`` with one warning: XLA cannot compile the collectives' ``tf.py_function``.
- :class:`MetricAverageCallback`: the epoch's metrics averaged over ranks (one collective).
- :class:`LearningRateScheduleCallback`, :class:`LearningRateWarmupCallback`: the learning rate as
  Horovod sets it (``initial_lr * multiplier(epoch)``; per batch unless ``staircase``).
  ``momentum_correction`` is accepted and has no effect: Keras 3 compiles the optimizer's momentum
  into the train step as a constant.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import keras
import torch

from shoal.horovod import ops as engine
from shoal.horovod import state
from shoal.horovod.errors import HorovodUsageError
from shoal.horovod.tensorflow.variables import broadcast_variables


def turn_off_jit(model: Any) -> None:
    """``model.jit_compile = False`` (one warning) when it was on: XLA cannot compile a tf.py_function."""
    if getattr(model, "jit_compile", False) and state.size() > 1:
        warnings.warn(
            "shoal.horovod: jit_compile turned off for this model: XLA cannot compile the tf.py_function "
            "that carries Horovod's collectives (compile(..., jit_compile=False) silences this)",
            stacklevel=3,
        )
        model.jit_compile = False
        model.make_train_function(force=True)


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Every rank starts training from root_rank's model and optimizer variables."""

    def __init__(self, root_rank: int, device: str = "", *args: Any) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False

    def on_train_begin(self, logs: Any = None) -> None:
        turn_off_jit(self.model)
        if self.broadcast_done:
            return
        broadcast_variables(self.model.variables, root_rank=self.root_rank)
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and optimizer.built:
            broadcast_variables(optimizer.variables, root_rank=self.root_rank)
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """At each epoch's end, every metric in ``logs`` becomes its average over the ranks."""

    def __init__(self, device: str = "", *args: Any) -> None:
        super().__init__()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if not logs or state.size() == 1:
            return
        names = sorted(name for name, value in logs.items() if _is_number(value))
        values = torch.tensor([float(logs[name]) for name in names], dtype=torch.float64)
        engine.allreduce_(values, name=f"metrics[{','.join(names)}]", op=engine.Average)
        logs.update(zip(names, values.tolist()))


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """The learning rate is ``initial_lr * multiplier(epoch)`` from ``start_epoch`` until ``end_epoch``.

    ``multiplier`` is a number or a function of the epoch (fractional within an epoch unless
    ``staircase``, in which case it changes at each epoch's start only).
    """

    def __init__(
        self,
        initial_lr: float,
        multiplier: float | Callable[[float], float],
        start_epoch: int = 0,
        end_epoch: int | None = None,
        staircase: bool = True,
        momentum_correction: bool = True,
        steps_per_epoch: int | None = None,
        *args: Any,
    ) -> None:
        super().__init__()
        self.initial_lr = initial_lr
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)
        self.start_epoch, self.end_epoch = start_epoch, end_epoch
        self.staircase = staircase
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0

    def _active(self, epoch: float) -> bool:
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _set(self, epoch: float) -> None:
        rate = self.model.optimizer.learning_rate
        if not hasattr(rate, "assign"):
            raise HorovodUsageError(
                "hvd.callbacks: the optimizer's learning rate is a schedule, which a callback cannot set",
                "give the optimizer a number as learning_rate, or drop the learning-rate callback",
            )
        rate.assign(self.initial_lr * self.multiplier(epoch))

    def on_train_begin(self, logs: Any = None) -> None:
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self.params.get("steps")
            if not self.steps_per_epoch:
                raise HorovodUsageError(
                    "hvd.callbacks: a per-batch learning-rate schedule needs the number of steps per epoch",
                    "pass steps_per_epoch=... to the callback (or to model.fit)",
                )

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.current_epoch = epoch
        if self.staircase and self._active(epoch):
            self._set(epoch)

    def on_batch_begin(self, batch: int, logs: Any = None) -> None:
        if self.staircase:
            return
        epoch = self.current_epoch + batch / self.steps_per_epoch
        if self._active(epoch):
            self._set(epoch)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Over ``warmup_epochs`` the learning rate rises from ``initial_lr / size()`` to ``initial_lr``
    (Goyal et al.'s warm-up, as Horovod's): pass the rate already scaled by ``hvd.size()``."""

    def __init__(
        self,
        initial_lr: float,
        warmup_epochs: int = 5,
        momentum_correction: bool = True,
        steps_per_epoch: int | None = None,
        verbose: int = 0,
        *args: Any,
    ) -> None:
        def multiplier(epoch: float) -> float:
            size = state.size()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, 0, warmup_epochs, False, momentum_correction, steps_per_epoch)
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if epoch == self.warmup_epochs - 1:
            self.model.optimizer.learning_rate.assign(self.initial_lr)
            if self.verbose and state.rank() == 0:
                print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {self.initial_lr:g}.")
