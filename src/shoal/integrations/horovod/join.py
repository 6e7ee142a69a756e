"""``hvd.join()``: a rank whose data is done keeps the others' gradient all-reduces company.

Horovod's coordinator lets a joined rank answer every all-reduce with zeros. shoal has no
coordinator: collectives pair up by order. What a joined rank can still answer is what it can
predict, the DistributedOptimizer's gradient buckets (it has the same model, so the same buckets):

- Every synchronisation's first bucket carries a flag element, 1 from each rank still training
  and 0 from each joined one, so its sum is the number of active ranks, learnt by every rank at
  no extra collective.
- A joined rank loops: it sends zeros for bucket 0, reads the active count and, while someone is
  active, sends zeros for the other buckets too. The active ranks' Average still divides by
  ``size()``, as Horovod's does (the joined ranks' zeros count).
- When the count is 0 every rank is inside ``join()``; they leave together, agree on the rank that
  joined last (one small all-reduce) and return it.

Without a DistributedOptimizer the loop is one small all-reduce per round, so every rank must
call ``join()`` at the same point: it is then a barrier that returns the last rank. With more than
one DistributedOptimizer a joined rank could not tell whose buckets come next: refused.
Collectives other than the gradient buckets are refused on the active ranks once they have seen
that a rank joined (Horovod supports allreduce there; here it would meet the joined rank's bucket).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from shoal.integrations.horovod import state
from shoal.integrations.horovod.errors import HorovodOrderError, HorovodUnsupported


def join(device: int = -1) -> int:
    """Wait, answering the others' gradient all-reduces with zeros, until every rank has joined.

    Returns the rank that joined last (the same on every rank). ``device`` (Horovod: where its zero
    tensors live) is not needed: the zeros live where the buckets do.
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
    while True:
        active = engine.shadow_round() if engine is not None else _control_round(job)
        job.rounds += 1
        if active == 0:
            break
    job.active_flag, job.joined_seen = None, False
    # The rank that joined last: the latest round, ties broken by the higher rank (both agreed by all).
    key = torch.tensor([joined_at * world + job.context.rank], dtype=torch.int64)
    dist.all_reduce(key, op=dist.ReduceOp.MAX, group=job.cpu_group)
    return int(key.item()) % world


def _control_round(job: state._Job) -> int:
    """A round without an optimizer: every rank here sends 0, so the count is 0 once all have joined.

    An odd size (7 doubles) keeps it from pairing silently with a user's small all-reduce: a
    mismatch fails at once in gloo ("Received data size doesn't match expected size").
    """
    flag = torch.zeros(7, dtype=torch.float64)  # on the CPU: the default group is gloo, or cpu_group is
    dist.all_reduce(flag, group=job.cpu_group)
    return round(float(flag[0]))
