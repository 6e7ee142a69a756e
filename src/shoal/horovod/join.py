"""``hvd.join()``: a rank whose data is done keeps the others' all-reduces company.

Horovod's coordinator lets a joined rank answer every all-reduce with zeros. shoal has no
coordinator: collectives pair up by order, so a joined rank must take part in whatever the others
issue next. It does so in one of two ways.

Without a DistributedOptimizer (:func:`agreement.listen`): every ``shoal.horovod`` collective
begins with an agreement round, and the joined rank takes part in each with a marker. The others
then send their full descriptions; an ``allreduce`` or ``grouped_allreduce`` with op Sum or Average
the joined rank answers with zeros (the Average still divides by ``size()``, as Horovod's), a
``barrier`` needs nothing more, and anything else (allgather, broadcast, alltoall, reducescatter,
other ops) every active rank refuses with the same ``HorovodInternalError``, as Horovod's
coordinator does ("... is not supported with Join at this time"). The round in which each rank
joined travels in its marker; once every rank sends the marker they all leave, naming the same last rank.

With one DistributedOptimizer the joined rank answers its gradient buckets instead, which start
without an agreement round (the optimizer's step stays one all-reduce per bucket):

- Every synchronisation's first bucket carries a flag element, 1 from each rank still training
  and 0 from each joined one, so its sum is the number of active ranks, learnt by every rank at
  no extra collective.
- A joined rank loops: it sends zeros for bucket 0, reads the active count and, while someone is
  active, sends zeros for the other buckets too. The active ranks' Average still divides by
  ``size()``, as Horovod's does (the joined ranks' zeros count).
- When the count is 0 every rank is inside ``join()``; they leave together, agree on the rank that
  joined last (one small all-reduce) and return it.

Collectives other than the gradient buckets are refused on the active ranks once they have seen
that a rank joined (the joined rank waits in the next bucket, not in an agreement round). With
more than one DistributedOptimizer a joined rank could not tell whose buckets come next: refused.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from shoal.horovod import agreement, state
from shoal.horovod.errors import HorovodOrderError, HorovodUnsupported
from shoal.horovod.ops import reduce_zeros


def join(device: int = -1) -> int:
    """Wait, answering the others' all-reduces with zeros, until every rank has joined.

    Returns the rank that joined last (the same on every rank). ``device`` (Horovod: where its zero
    tensors live) is not needed: the zeros live where the others' tensors do.
    """
    job = state.job("join()")
    world = job.context.world_size
    if world == 1:
        return 0
    optimizers = [opt for opt in job.optimizers if opt._hvd is not None]
    if len(optimizers) > 1:
        raise HorovodUnsupported(
            f"hvd.join() with {len(optimizers)} DistributedOptimizers: a joined rank cannot tell whose "
            "gradient all-reduces come next",
            "call hvd.join() only where every rank has finished (or wrap a single optimizer)",
        )
    engine = optimizers[0]._hvd if optimizers else None
    if engine is not None and engine.backward_seen():
        raise HorovodOrderError(
            "hvd.join() was called after loss.backward() but before optimizer.step()",
            "call optimizer.step() first, then hvd.join() once this rank has no more batches",
        )
    joined_at = job.rounds
    if engine is None:
        return _listen_until_all_joined(joined_at)
    while True:
        active = engine.shadow_round()
        job.rounds += 1
        if active == 0:
            break
    job.active_flag, job.joined_seen = None, False
    # The rank that joined last: the latest round, ties broken by the higher rank (both agreed by all).
    key = torch.tensor([joined_at * world + job.context.rank], dtype=torch.int64)
    dist.all_reduce(key, op=dist.ReduceOp.MAX, group=job.cpu_group)
    return int(key.item()) % world


def _listen_until_all_joined(joined_at: int) -> int:
    """Answer the others' collectives (module docstring) until every rank has joined; the last rank."""
    while True:
        heard = agreement.listen(joined_at)
        if heard.done:
            return heard.last
        if heard.reduce is not None:
            reduce_zeros(heard.reduce)
