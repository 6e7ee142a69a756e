"""The data layer: a deterministic, resumable sharded sampler and the loaders built on it.

* :class:`ShardedSampler`: one global order per epoch (independent of the world size), split over
  ranks by striding, with a position that survives a restart under a different world size.
* :class:`TensorBatchLoader`: the fast path for in-memory tensors (one gather per batch).
* :class:`ShardedDataLoader`: the same contract around ``torch.utils.data.DataLoader``.
* :func:`make_loader`: picks between the two.
"""

from __future__ import annotations

from .dataloader import ShardedDataLoader
from .loader import TensorBatchLoader, make_loader
from .sampler import ShardedSampler

__all__ = ["ShardedDataLoader", "ShardedSampler", "TensorBatchLoader", "make_loader"]
