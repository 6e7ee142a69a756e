"""The Horovod tutorial's setup in one call, for benchmarks and examples that compare it with DDP.

:func:`prepare` is steps 1, 6 and 5 of the tutorial (``hvd.init()``, broadcast the initial state
from rank 0, wrap the optimizer); pinning a GPU, scaling the learning rate, sharding the data and
checkpointing on rank 0 stay the caller's, as in a real script.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from shoal.horovod import state
from shoal.horovod.functions import broadcast_optimizer_state, broadcast_parameters
from shoal.horovod.optimizer import DistributedOptimizer


def prepare(model: nn.Module, optimizer: torch.optim.Optimizer, *, root_rank: int = 0, **options: Any):
    """``hvd.init()``, root_rank's weights and optimizer state everywhere, and the DistributedOptimizer.

    ``options`` go to :func:`DistributedOptimizer` (``compression``, ``backward_passes_per_step``,
    ``op``, ``gradient_predivide_factor``). Train with the returned optimizer exactly as with the
    one passed in: ``loss.backward()``, ``optimizer.step()``, ``optimizer.zero_grad()``.
    """
    state.init()
    broadcast_parameters(model.state_dict(), root_rank=root_rank)
    broadcast_optimizer_state(optimizer, root_rank=root_rank)
    return DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), **options)
