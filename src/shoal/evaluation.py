"""Exact distributed evaluation: every sample of the evaluation set counted once, on some rank."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from shoal.distributed import collectives
from shoal.distributed.collectives import all_reduce_sum, broadcast_object
from shoal.distributed.fsdp import is_fsdp
from shoal.distributed.wrap import unwrap_model
from shoal.errors import ShoalError


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Iterable,
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    metrics_fn: Callable[[torch.Tensor, torch.Tensor], dict[str, torch.Tensor]] | None = None,
    metric_names: Sequence[str] | None = None,
    autocast: Callable | None = None,
    filler: torch.Tensor | None = None,
) -> dict[str, float]:
    """Mean loss and metrics (default: accuracy) over the whole set that ``loader`` shards across ranks.

    ``loader`` must hand each sample to exactly one rank (``ctx.eval_loader``: no padding), so the
    sums over ranks are exact. ``loss_fn(outputs, targets)`` must return the *mean* over the batch
    (like ``F.cross_entropy``); it is re-weighted by batch size. ``metrics_fn(outputs, targets)``
    returns per-batch *sums* by name (default ``{"accuracy": correct predictions}``); each is summed
    over batches and ranks and divided by the sample count. ``metric_names``: the names it returns
    (else rank 0 tells the others, one small broadcast: a rank may see no batch). The model is run unwrapped
    so that ranks holding different numbers of batches never wait on DDP's collectives.

    An FSDP model's forward is collective (it all-gathers each block's parameters): a rank with
    fewer batches runs as many extra forwards as it lacks, on ``filler`` (an input batch, e.g. the
    test set's first sample) if given, else on its last inputs, their outputs discarded, so the sums
    stay exact and nobody waits. A rank with no batch at all and no ``filler`` has no input to run:
    that is a ShoalError on every rank (one small all-reduce agrees on the counts first).

    Returns ``{"loss": ..., <metric>: ..., "samples": N}``.
    """
    loss_fn = loss_fn or F.cross_entropy
    metrics_fn = metrics_fn or _accuracy
    names = list(metric_names) if metric_names is not None else (["accuracy"] if metrics_fn is _accuracy else None)
    net = unwrap_model(model)
    most = (
        _most_batches(loader, next(net.parameters()).device, filler is not None)
        if collectives.world_size() > 1 and is_fsdp(net)
        else None
    )
    was_training = net.training
    net.eval()
    totals = None
    seen, inputs = 0, None
    for batch in loader:
        inputs, targets = batch[0], batch[1]
        seen += 1
        outputs = _forward(net, inputs, autocast)
        outputs = outputs.float() if outputs.is_floating_point() else outputs
        n = targets.shape[0]
        sums = metrics_fn(outputs, targets)
        if names is None:
            names = list(sums)
        batch_sums = torch.stack(
            [
                loss_fn(outputs, targets).detach().double() * n,
                *(torch.as_tensor(sums[name], device=targets.device).detach().double().sum() for name in names),
                torch.tensor(float(n), dtype=torch.float64, device=targets.device),
            ]
        )
        totals = batch_sums if totals is None else totals + batch_sums
    for _ in range(most - seen if most is not None else 0):
        # FSDP: the others' all-gathers need this rank's part.
        _forward(net, filler if filler is not None else inputs, autocast)
    if metric_names is None and metrics_fn is not _accuracy:
        # A rank without a single test sample (a tiny set on many ranks) cannot know the names of
        # custom metrics; rank 0 has a sample whenever anyone has, and tells them.
        names = broadcast_object(names)
    if totals is None:  # this rank got no samples (tiny set, many ranks)
        device = next(net.parameters()).device
        totals = torch.zeros(2 + len(names or ()), dtype=torch.float64, device=device)
    net.train(was_training)
    loss_sum, *metric_sums, count = all_reduce_sum(totals).tolist()
    names = names or []
    if count == 0:
        return {"loss": float("nan"), **{name: float("nan") for name in names}, "samples": 0}
    return {"loss": loss_sum / count, **{n: s / count for n, s in zip(names, metric_sums)}, "samples": int(count)}


def _forward(net: nn.Module, inputs: torch.Tensor, autocast: Callable | None) -> torch.Tensor:
    if autocast is None:
        return net(inputs)
    with autocast():
        return net(inputs)


def _most_batches(loader: Iterable, device: torch.device, has_filler: bool) -> int:
    """The most batches any rank holds; ShoalError on every rank when some rank holds none and
    there is no filler to run."""
    try:
        mine = len(loader)  # type: ignore[arg-type]
    except TypeError:
        mine = -1
    import torch.distributed as dist

    counts = torch.tensor([mine, -mine], dtype=torch.int64, device=device)

    dist.all_reduce(counts, op=dist.ReduceOp.MAX)
    most, fewest = int(counts[0]), -int(counts[1])
    if fewest < 0:
        raise ShoalError(
            "evaluating an FSDP model needs a loader with a length on every rank (its forward is collective)",
            "pass a DataLoader (ctx.eval_loader(...)), not an iterator",
        )
    if fewest == 0 < most and not has_filler:
        raise ShoalError(
            f"evaluating an FSDP model: some rank has no evaluation batch while another has {most} "
            "(every rank must run the collective forward)",
            "use fewer processes or a smaller evaluation batch, so that every rank gets at least one batch",
        )
    return most


def _accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"accuracy": (outputs.argmax(dim=1) == targets).sum()}
