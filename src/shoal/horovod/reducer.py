"""The engine behind ``hvd.DistributedOptimizer``: gradient buckets all-reduced while backward runs.

How a step goes (more than one process):

1. At construction the parameters are grouped into buckets (:mod:`.buckets`: reverse parameter
   order, roughly the order backward produces gradients; one device and dtype per bucket), and a
   post-accumulate-grad hook (``Tensor.register_post_accumulate_grad_hook``) is put on each
   parameter. One collective checks that every rank has the same parameters (names, shapes,
   dtypes): a rank with another model would otherwise pair the wrong buffers.
2. During ``loss.backward()`` each hook counts its parameter's backward passes. On the
   ``backward_passes_per_step``-th pass the gradient is ready; once every gradient of a bucket is,
   the bucket is packed into one flat buffer (scaled by ``1 / gradient_predivide_factor`` for
   Average, compressed) and its all-reduce starts asynchronously. Buckets start strictly in index
   order on every rank, so all ranks issue the same collectives in the same order (gloo and NCCL
   pair collectives by order, not by name).
3. ``step()`` (or ``synchronize()``) starts any bucket not started yet (an unused parameter
   contributes zeros, as in Horovod), waits for all of them, scales the sums (Average:
   ``gradient_predivide_factor / size``) and copies them back into ``p.grad``; then the wrapped
   optimizer's own ``step`` runs.

The first bucket carries one extra element, 1 on every rank still training and 0 on a rank that
has called :func:`~shoal.horovod.join.join`: its sum tells every rank how many are
still active, at no extra collective (see :mod:`.join`).

Sparse gradients (``nn.Embedding(sparse=True)``) leave the buckets after the first synchronisation
and travel as indices and values, as Horovod's do, unless ``sparse_as_dense=True``
(:mod:`.sparse_grads`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from shoal.horovod import buckets, sparse_grads, state
from shoal.horovod.errors import HorovodOrderError
from shoal.horovod.ops import ReduceOp


class _Bucket:
    """Parameters whose gradients travel together, and the flat buffer they travel in."""

    def __init__(self, index: int, params: list[torch.Tensor], with_flag: bool, like: torch.Tensor) -> None:
        self.index = index
        self.params = params
        self.numel = buckets.total_numel(params)
        # Bucket 0 carries the join flag in one extra element at the end (alone when every gradient is sparse).
        kind = params[0] if params else like
        self.flat = torch.zeros(self.numel + (1 if with_flag else 0), dtype=kind.dtype, device=kind.device)
        self.views = buckets.views(self.flat, params)
        """Each parameter's slice of ``flat``, shaped like the parameter."""
        self.ready = 0


class GradientReducer:
    """The gradient all-reduces of one DistributedOptimizer (kept apart from the optimizer's own fields).

    ``hooks`` holds the handles of the post-accumulate-grad hooks the optimizer registered, which
    call :meth:`on_gradient`.
    """

    def __init__(
        self,
        params: list[torch.Tensor],
        *,
        compression: Any,
        op: ReduceOp,
        predivide: float,
        passes: int,
        sparse_as_dense: bool,
    ) -> None:
        job = state.job("DistributedOptimizer()")
        self.world = job.context.world_size
        self.compression = compression
        self.op = op
        self.predivide = predivide
        self.passes_per_step = passes
        self.params = params
        self.sparse: list[torch.Tensor] | None = [] if sparse_as_dense else None
        """The parameters whose gradients travel sparse; None until the first synchronisation settles it."""
        self._plan(params)
        self.passes: dict[torch.Tensor, int] = dict.fromkeys(params, 0)
        self.next_to_start = 0
        self.in_flight: list[tuple[_Bucket, Any, torch.Tensor, Any]] = []
        self.hooks: list[Any] = []

    def _plan(self, dense: list[torch.Tensor]) -> None:
        """Lay the buckets out for the gradients reduced densely (reverse order); bucket 0 always exists."""
        first_cap, cap = buckets.bucket_caps()
        order = list(reversed(dense))
        groups = buckets.plan_buckets(order, first_cap, cap) or [[]]
        self.buckets = [
            _Bucket(i, [order[j] for j in indices], with_flag=(i == 0), like=self.params[0])
            for i, indices in enumerate(groups)
        ]
        self.bucket_of = {p: b for b in self.buckets for p in b.params}

    # -- during backward ---------------------------------------------------------------------------

    def on_gradient(self, param: torch.Tensor) -> None:
        seen = self.passes[param] + 1
        if seen > self.passes_per_step:
            raise HorovodOrderError(
                f"a gradient was computed {seen} times before optimizer.step(), more than "
                f"backward_passes_per_step={self.passes_per_step}",
                "call optimizer.step() (or synchronize()) after every backward_passes_per_step backward passes, "
                "or raise backward_passes_per_step to accumulate more",
            )
        self.passes[param] = seen
        bucket = self.bucket_of.get(param)  # None for a sparse gradient: gathered in synchronize()
        if seen == self.passes_per_step and bucket is not None:
            bucket.ready += 1
            while self.next_to_start < len(self.buckets) and self._full(self.buckets[self.next_to_start]):
                self.start(self.buckets[self.next_to_start])

    def _full(self, bucket: _Bucket) -> bool:
        return bucket.ready == len(bucket.params)

    def backward_seen(self) -> bool:
        """True between a backward pass and the synchronisation that consumes its gradients."""
        return bool(self.in_flight) or any(count for count in self.passes.values())

    # -- the collectives ---------------------------------------------------------------------------

    def start(self, bucket: _Bucket, *, active: bool = True) -> None:
        """Pack ``bucket`` (zeros when this rank has joined) and start its all-reduce."""
        flat = bucket.flat
        with torch.no_grad():
            if active:
                buckets.copy_all(bucket.views, [self._dense_grad(param) for param in bucket.params])
                if self.op is ReduceOp.Average and self.predivide != 1.0:
                    flat[: bucket.numel].mul_(1.0 / self.predivide)
            else:
                flat.zero_()
            if bucket.index == 0:
                flat[-1] = 1.0 if active else 0.0
            wire, context = self.compression.compress(flat)
            work = dist.all_reduce(wire, op=dist.ReduceOp.SUM, group=state.group_for(wire), async_op=True)
        self.in_flight.append((bucket, work, wire, context))
        self.next_to_start = bucket.index + 1

    def _dense_grad(self, param: torch.Tensor) -> torch.Tensor:
        grad = param.grad
        if grad is None:
            return torch.zeros_like(param)
        if grad.is_sparse:  # sparse_as_dense, or before the first synchronisation settled the sparse ones
            return grad.to_dense()
        return grad

    def finish(self) -> torch.Tensor | None:
        """Wait for every bucket and write the reduced gradients back.

        Returns bucket 0's summed flag (how many ranks are active) as a 1-element tensor, not a
        number: reading it would make the CPU wait for a GPU all-reduce; it is read when needed.
        """
        flag = None
        with torch.no_grad():
            for bucket, work, wire, context in self.in_flight:
                work.wait()
                flat = self.compression.decompress(wire, context)
                if bucket.index == 0:
                    flag = flat[-1:].clone()
                if self.op is ReduceOp.Average:
                    flat = flat[: bucket.numel].mul_(self.predivide / self.world)
                self._write_back(bucket, flat)
        self.reset()
        return flag

    def _write_back(self, bucket: _Bucket, flat: torch.Tensor) -> None:
        reduced = bucket.views if flat.data_ptr() == bucket.flat.data_ptr() else buckets.views(flat, bucket.params)
        targets, sources = [], []
        for param, result in zip(bucket.params, reduced):
            if param.grad is None:
                param.grad = result.clone()
            elif param.grad.is_sparse:
                param.grad = result.to_sparse()
            else:
                targets.append(param.grad)
                sources.append(result)
        buckets.copy_all(targets, sources)

    def reset(self) -> None:
        self.in_flight.clear()
        self.next_to_start = 0
        for bucket in self.buckets:
            bucket.ready = 0
        for param in self.passes:
            self.passes[param] = 0

    def synchronize(self) -> None:
        """Start what has not started (in order), wait for all, write back; note a joined peer."""
        while self.next_to_start < len(self.buckets):
            self.start(self.buckets[self.next_to_start])
        flag = self._finish_with_sparse(active=True)
        job = state.job("synchronize()")
        job.rounds += 1
        job.active_flag = flag

    def shadow_round(self) -> int:
        """A joined rank's part of one synchronisation: zeros for every bucket; the active count.

        The active count arrives with bucket 0; when it is 0 every rank is in ``join()`` and the
        other buckets are not sent (by anyone), nor sparse gradients.
        """
        self.reset()
        self.start(self.buckets[0], active=False)
        active = active_count(self.finish())
        if active > 0:
            for bucket in self.buckets[1:]:
                self.start(bucket, active=False)
            self._finish_with_sparse(active=False)
        return active

    def _finish_with_sparse(self, *, active: bool) -> torch.Tensor | None:
        """:meth:`finish`, with the sparse gradients' exchange beside it (:mod:`.sparse_grads`).

        Called once every bucket has started, in the same order on every rank: the settling
        all-reduce (first time only) and the sparse gather go after the buckets. The local
        gradients are read before :meth:`finish` writes the dense results over them.
        """
        settling = self.sparse is None
        if settling:
            self.sparse = sparse_grads.settle(self.params, active)
        exchange = sparse_grads.start_exchange(self.sparse, active) if self.sparse else None
        flag = self.finish()
        if exchange is not None:
            divide_by = self.world if self.op is ReduceOp.Average else 1
            with torch.no_grad():
                sparse_grads.write_back(self.sparse, exchange.wait(), divide_by)
        if settling and self.sparse:
            gathered = set(self.sparse)
            self._plan([p for p in self.params if p not in gathered])
        return flag

    def remove_hooks(self) -> None:
        for handle in self.hooks:
            handle.remove()
        self.hooks.clear()


def active_count(flag: torch.Tensor | None) -> int:
    """The number of active ranks that bucket 0's summed flag holds (exact up to 2048 ranks in float16)."""
    assert flag is not None, "bucket 0 was not reduced"
    return round(float(flag.item()))
