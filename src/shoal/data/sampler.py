"""A deterministic, resumable sampler that shards one global order over any number of ranks.

The contract, in one place:

* Epoch ``e``'s *global order* is ``torch.randperm(N, generator=Generator().manual_seed(seed + e))``
  (``arange(N)`` without shuffling). It does not depend on the world size.
* The sampler remembers ``consumed``: how many samples of that order have already been handed out
  (over all ranks). Rank ``r`` of ``W`` gets the strided shard ``order[consumed + r :: W]`` of the
  rest, like ``DistributedSampler``. With per-rank batch ``B`` the ``k``-th global step therefore
  covers exactly ``order[consumed + kBW : consumed + (k+1)BW]`` whatever ``W`` is: 2 ranks x batch
  ``B`` see the same samples per step as 1 rank x batch ``2B``.
* Because the position is a point in the *global* order, a state saved under one world size
  resumes under any other: the rest of the epoch is re-split over the new ranks and every sample is
  still seen exactly once (plus padding).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import Sampler

STATE_VERSION = 1


class ShardedSampler(Sampler[int]):
    """This rank's share of a deterministic global order, resumable mid-epoch.

    Args:
        num_samples: size of the dataset (``N``).
        rank: this process's rank, ``0 <= rank < world_size``.
        world_size: number of ranks sharing the data.
        shuffle: shuffle the global order per epoch (training); ``False`` gives ``arange(N)``.
        seed: epoch ``e`` uses ``seed + e``; every rank must pass the same seed.
        drop_last: drop the tail of the order that does not fill a whole *global* batch
            (``batch_size * world_size``), or, without ``batch_size``, the tail that does not
            divide by ``world_size`` (like ``DistributedSampler``). Takes precedence over ``pad``.
        pad: when the rest does not divide by ``world_size``, pad it with the start of the epoch's
            order so every rank yields the same count (DDP needs equal step counts). ``pad=False`` is for exact
            evaluation: no sample twice, ranks may differ by one.
        batch_size: the per-rank batch size; only needed for ``drop_last``.

    Iteration yields this rank's indices from the current position; it does not move the position.
    The loaders call :meth:`advance` as they hand batches out, which is what makes
    :meth:`state_dict` resume at the next batch.
    """

    def __init__(
        self,
        num_samples: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        pad: bool = True,
        batch_size: int | None = None,
    ) -> None:
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.num_samples = int(num_samples)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.pad = bool(pad)
        self.batch_size = batch_size
        self._epoch = 0
        self._consumed = 0
        # True between load_state_dict() and the start of the next pass: set_epoch() for the loaded
        # epoch must then keep the loaded position instead of rewinding it.
        self._resume_pending = False
        self._order_cache: tuple[int, torch.Tensor] | None = None

    # -- position -------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def consumed(self) -> int:
        """Samples of this epoch's global order already handed out, over all ranks."""
        return self._consumed

    @property
    def epoch_done(self) -> bool:
        """Whether this epoch has nothing left to hand out (a ``drop_last`` tail does not count)."""
        return self._stop() <= self._consumed

    @property
    def num_remaining(self) -> int:
        """Real (non-padding) samples the rest of this epoch will hand out, over all ranks.

        The drop of ``drop_last`` is already taken off. The difference of this value before and
        after a step is the exact number of distinct samples that step covered globally.
        """
        return self._stop() - self._consumed

    def set_epoch(self, epoch: int) -> None:
        """Go to ``epoch`` and rewind to its start.

        Exception: right after :meth:`load_state_dict` for that same epoch the loaded position is
        kept, so ``load_state_dict(...)`` followed by the usual ``set_epoch(e)`` resumes mid-epoch.
        """
        epoch = int(epoch)
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if self._resume_pending and epoch == self._epoch:
            return
        self._resume_pending = False
        self._epoch = epoch
        self._consumed = 0

    def advance(self, global_samples: int) -> None:
        """Mark ``global_samples`` more of the global order as handed out (over all ranks).

        Loaders call this with ``batch_size * world_size`` per step. Reaching the end of what this
        epoch hands out (including a step that was partly padding, or a dropped tail) completes
        the epoch: ``consumed`` becomes ``num_samples``. ``advance(num_remaining)`` ends the epoch.
        """
        if global_samples < 0:
            raise ValueError(f"cannot advance by a negative count ({global_samples})")
        self._resume_pending = False
        new = self._consumed + int(global_samples)
        self._consumed = self.num_samples if new >= self._stop() else new

    # -- the order ------------------------------------------------------------------------------

    def global_order(self, epoch: int | None = None) -> torch.Tensor:
        """Epoch ``epoch``'s order of all ``N`` indices (int64), the same on every rank and world size.

        ``epoch`` defaults to the current one. The result is a new tensor the caller may modify.
        """
        return self._order(self._epoch if epoch is None else int(epoch)).clone()

    def _order(self, epoch: int) -> torch.Tensor:
        # Cached: indices() needs it at every pass, and a randperm of N is O(N).
        if self._order_cache is not None and self._order_cache[0] == epoch:
            return self._order_cache[1]
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + epoch)
            order = torch.randperm(self.num_samples, generator=g)
        else:
            order = torch.arange(self.num_samples)
        self._order_cache = (epoch, order)
        return order

    def _stop(self) -> int:
        """Position in the global order where this epoch's real samples end (after drop_last)."""
        rest = self.num_samples - self._consumed
        if rest <= 0:
            return self._consumed
        if self.drop_last:
            unit = self.world_size * (self.batch_size or 1)
            return self._consumed + rest // unit * unit
        return self.num_samples

    def _per_rank_count(self, rank: int) -> int:
        real = self._stop() - self._consumed
        if real <= 0:
            return 0
        if self.pad or self.drop_last:  # after drop_last, real divides by world_size
            return -(-real // self.world_size)
        return len(range(rank, real, self.world_size))

    def indices(self) -> torch.Tensor:
        """This rank's indices (int64) for the rest of the current epoch; starts a pass.

        Computed eagerly as one tensor so the result does not change while a loader advances the
        position (a ``DataLoader`` with workers draws indices ahead of the batches it yields).
        """
        self._resume_pending = False
        real = self._stop() - self._consumed
        if real <= 0:
            return torch.empty(0, dtype=torch.int64)
        order = self._order(self._epoch)
        rest = order[self._consumed : self._consumed + real]
        count = self._per_rank_count(self.rank)
        total = count * self.world_size if (self.pad or self.drop_last) else real
        if total > real:
            # Pad from the start of the epoch's order (cycling it if the pad is longer), not from
            # the start of the rest: then a resume under the same world size replays the
            # uninterrupted run batch for batch, padding included. A fresh epoch pads like
            # DistributedSampler.
            rest = torch.cat([rest, order[torch.arange(total - real) % self.num_samples]])
        # A contiguous copy: batch slices are then plain contiguous indices, and a caller writing
        # into the result cannot corrupt the cached order.
        return rest[self.rank : total : self.world_size].clone(memory_format=torch.contiguous_format)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        """This rank's count for the current epoch from the current position."""
        return self._per_rank_count(self.rank)

    # -- resume ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The position, as plain Python values (safe to ``torch.save`` or JSON)."""
        return {
            "version": STATE_VERSION,
            "epoch": self._epoch,
            "consumed": self._consumed,
            "seed": self.seed,
            "num_samples": self.num_samples,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at ``state``'s position; any world size and rank may load any rank's state.

        Raises:
            ValueError: the state is from another version, dataset size, seed or shuffle setting
                (resuming would silently see a different order).
        """
        missing = [k for k in ("version", "epoch", "consumed", "seed", "num_samples", "shuffle") if k not in state]
        if missing:
            raise ValueError(f"sampler state is missing {', '.join(missing)}")
        if state["version"] != STATE_VERSION:
            raise ValueError(f"sampler state version {state['version']} is not supported (expected {STATE_VERSION})")
        for key, mine in (("num_samples", self.num_samples), ("seed", self.seed), ("shuffle", self.shuffle)):
            if state[key] != mine:
                raise ValueError(
                    f"sampler state mismatch: {key} is {state[key]!r} in the saved state but {mine!r} in this sampler"
                )
        consumed, epoch = int(state["consumed"]), int(state["epoch"])
        if not 0 <= consumed <= self.num_samples:
            raise ValueError(f"sampler state has consumed={consumed}, outside [0, {self.num_samples}]")
        if epoch < 0:
            raise ValueError(f"sampler state has epoch={epoch} (must be >= 0)")
        self._epoch, self._consumed = epoch, consumed
        self._resume_pending = True

    def __repr__(self) -> str:
        return (
            f"ShardedSampler(num_samples={self.num_samples}, rank={self.rank}, world_size={self.world_size}, "
            f"shuffle={self.shuffle}, seed={self.seed}, epoch={self._epoch}, consumed={self._consumed})"
        )
