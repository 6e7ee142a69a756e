"""Exact distributed evaluation: every sample of the evaluation set counted once, on some rank."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from shoal.distributed.collectives import all_reduce_sum
from shoal.distributed.wrap import unwrap_model


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Iterable,
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    autocast: Callable | None = None,
) -> dict[str, float]:
    """Mean loss and accuracy over the whole set that ``loader`` shards across ranks.

    ``loader`` must hand each sample to exactly one rank (``ctx.eval_loader``: no padding), so the
    sums over ranks are exact. ``loss_fn(logits, targets)`` must return the *mean* over the batch
    (like ``F.cross_entropy``); it is re-weighted by batch size. The model is run unwrapped so that
    ranks holding different numbers of batches never wait on DDP's collectives.
    """
    loss_fn = loss_fn or F.cross_entropy
    net = unwrap_model(model)
    was_training = net.training
    net.eval()
    totals = None
    for batch in loader:
        inputs, targets = batch[0], batch[1]
        if autocast is not None:
            with autocast():
                logits = net(inputs)
        else:
            logits = net(inputs)
        n = targets.shape[0]
        batch_sums = torch.stack(
            [
                loss_fn(logits.float(), targets).detach().double() * n,
                (logits.argmax(dim=1) == targets).sum().double(),
                torch.tensor(float(n), dtype=torch.float64, device=targets.device),
            ]
        )
        totals = batch_sums if totals is None else totals + batch_sums
    if totals is None:  # this rank got no samples (tiny set, many ranks)
        device = next(net.parameters()).device
        totals = torch.zeros(3, dtype=torch.float64, device=device)
    net.train(was_training)
    loss_sum, correct, count = all_reduce_sum(totals).tolist()
    if count == 0:
        return {"loss": float("nan"), "accuracy": float("nan"), "samples": 0}
    return {"loss": loss_sum / count, "accuracy": correct / count, "samples": int(count)}
