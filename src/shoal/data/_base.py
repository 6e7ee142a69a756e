"""What both loaders share: batch-size checks, epoch bookkeeping, resume state, device moves."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from shoal.errors import ShoalError

from .sampler import ShardedSampler

Transform = Callable[[Any], Any]


def check_batch_size(batch_size: int) -> int:
    """``batch_size`` as an int, or a :class:`ShoalError` saying how to fix it."""
    try:
        value = operator.index(batch_size)  # ints and numpy integers; not floats or bools
    except TypeError:
        value = None
    if value is None or isinstance(batch_size, bool) or value < 1:
        raise ShoalError(f"batch size must be at least 1, got {batch_size!r}", "pass --batch-size 1 or more")
    return value


def as_device(device: torch.device | str | int | None) -> torch.device | None:
    """``device`` as a ``torch.device``; a bare ``"cuda"`` gets the current device's index, so it
    compares equal to the device of tensors already there."""
    if device is None:
        return None
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def move_to(batch: Any, device: torch.device, non_blocking: bool) -> Any:
    """``batch`` with every tensor (in tuples, lists and dicts too) moved to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(move_to(b, device, non_blocking) for b in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to(b, device, non_blocking) for b in batch)
    if isinstance(batch, Mapping):
        return {k: move_to(v, device, non_blocking) for k, v in batch.items()}
    return batch


class ResumableLoader:
    """Epoch bookkeeping shared by the loaders; subclasses implement :meth:`_batches`.

    Epoch rule: a fresh ``iter()`` starts the next epoch when the current one is complete, unless
    :meth:`set_epoch` was called since, so a plain ``for epoch ...: for batch in loader`` reshuffles
    every epoch without ``set_epoch``. An unfinished epoch (a loop that broke out, or a state loaded
    mid-epoch) continues where it stopped: the position only ever moves as batches are handed out.
    """

    def __init__(self, batch_size: int, sampler: ShardedSampler) -> None:
        self.batch_size = check_batch_size(batch_size)
        if not isinstance(sampler, ShardedSampler):
            raise TypeError(f"sampler must be a ShardedSampler, not {type(sampler).__name__}")
        self._sampler = sampler
        # True while the current epoch was chosen explicitly (a fresh loader starts at its epoch);
        # cleared when a pass starts, so later completed passes move on automatically.
        self._epoch_pinned = True

    @property
    def sampler(self) -> ShardedSampler:
        return self._sampler

    @property
    def epoch(self) -> int:
        """The epoch the current (or next) pass draws from."""
        return self._sampler.epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass draw epoch ``epoch`` from its start (or from a just-loaded position)."""
        self._sampler.set_epoch(epoch)
        self._epoch_pinned = True

    def _start_pass(self) -> None:
        if self._sampler.epoch_done and not self._epoch_pinned:
            self._sampler.set_epoch(self._sampler.epoch + 1)
        self._epoch_pinned = False

    def _step_samples(self) -> int:
        """Global samples one step covers: every rank's batch."""
        return self.batch_size * self._sampler.world_size

    def _finish_pass(self) -> None:
        # With pad=False a rank can run out one batch before the others, and a drop_last tail is
        # never handed out; completing the epoch here leaves every rank at consumed == num_samples
        # (so every rank's state_dict is identical after a pass).
        self._sampler.advance(self._sampler.num_remaining)

    def __iter__(self) -> Iterator[Any]:
        self._start_pass()
        return self._batches()

    def _batches(self) -> Iterator[Any]:
        raise NotImplementedError

    def __len__(self) -> int:
        """Batches this rank yields in the current epoch from the current position."""
        sampler = self._sampler
        if sampler.epoch_done and not self._epoch_pinned:
            # The next pass is a whole new epoch; its length is what the first pass's was.
            return -(-_fresh_epoch_count(sampler) // self.batch_size)
        return -(-len(sampler) // self.batch_size)

    def state_dict(self) -> dict[str, Any]:
        """The position; the sampler's state (see :meth:`ShardedSampler.state_dict`)."""
        return self._sampler.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at ``state``'s position, under any world size; a completed epoch moves on."""
        self._sampler.load_state_dict(state)
        self._epoch_pinned = False


def _fresh_epoch_count(sampler: ShardedSampler) -> int:
    probe = ShardedSampler(
        sampler.num_samples,
        rank=sampler.rank,
        world_size=sampler.world_size,
        shuffle=sampler.shuffle,
        seed=sampler.seed,
        drop_last=sampler.drop_last,
        pad=sampler.pad,
        batch_size=sampler.batch_size,
    )
    return len(probe)
