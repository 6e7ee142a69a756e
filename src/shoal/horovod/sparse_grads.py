"""The DistributedOptimizer's sparse gradients (``nn.Embedding(sparse=True)``): indices and values gathered.

Horovod reduces a sparse gradient by gathering every rank's indices and values
(``sparse_allreduce_async``) unless ``sparse_as_dense=True``. Which parameters get sparse
gradients shows only in backward, after the reducer's buckets were laid out, and every rank must
take the same path for each parameter (collectives pair up by order). So:

1. The first synchronisation reduces every gradient in its bucket (a sparse one converted to dense)
   and then :func:`settle` asks, in one small all-reduce, which parameters had a sparse gradient
   on any rank. Every rank gets the same answer.
2. Those parameters leave the buckets. From then on (the first synchronisation included, whose
   dense result for them is replaced) their gradients travel as indices and values, all of them
   in one :func:`start_exchange` per step, and each becomes the sum (Average: divided by
   ``size()``) as a coalesced sparse tensor. A rank without a gradient for one, or a joined rank,
   sends none.

A parameter none of whose gradients was sparse at the first synchronisation stays in its bucket
(a later sparse gradient is reduced densely: the same sum, more bytes).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from shoal.horovod import state
from shoal.horovod.exchange import gather_ragged
from shoal.horovod.ops import Handle


def settle(params: list[torch.Tensor], active: bool) -> list[torch.Tensor]:
    """The parameters (in ``params``' order) whose gradient is sparse on at least one rank.

    One all-reduce; every rank must call it at the same point. ``active`` is False on a rank inside
    ``hvd.join()`` (its gradients do not count).
    """
    flags = torch.tensor([int(active and _is_sparse(p.grad)) for p in params], dtype=torch.int32)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=state.object_group())
    return [param for param, flag in zip(params, flags.tolist()) if flag]


def _is_sparse(grad: torch.Tensor | None) -> bool:
    return grad is not None and grad.is_sparse


def start_exchange(params: list[torch.Tensor], active: bool) -> Handle:
    """Start gathering every rank's rows of each parameter's gradient; the handle's result is the list
    of ``[indices, values]`` pairs flattened (indices ``[n, 1]``, values ``[n, *shape[1:]]``)."""
    tensors: list[torch.Tensor] = []
    for param in params:
        tensors.extend(_rows(param, param.grad if active else None))
    return gather_ragged("sparse_gradients", tensors, None)


def _rows(param: torch.Tensor, grad: torch.Tensor | None) -> list[torch.Tensor]:
    """``grad`` as (row indices ``[n, 1]``, rows ``[n, *shape[1:]]``): an embedding gradient's layout.

    A dense gradient (a rank where the parameter was used differently) is turned into its rows too,
    so that the sum stays exact.
    """
    if grad is None:
        return [torch.zeros((0, 1), dtype=torch.int64, device=param.device), param.new_zeros((0, *param.shape[1:]))]
    if not grad.is_sparse:
        grad = grad.to_sparse(1)
    elif grad.sparse_dim() != 1:
        grad = grad.to_dense().to_sparse(1)
    return [grad._indices().t().contiguous(), grad._values().contiguous()]


def write_back(params: list[torch.Tensor], gathered: list[torch.Tensor], divide_by: int) -> None:
    """Each parameter's gradient becomes the gathered rows summed (values divided by ``divide_by``)."""
    for index, param in enumerate(params):
        indices, values = gathered[2 * index], gathered[2 * index + 1]
        if divide_by > 1:
            values = values / divide_by
        reduced = torch.sparse_coo_tensor(indices.t(), values, param.shape, check_invariants=False)
        param.grad = reduced.coalesce()
