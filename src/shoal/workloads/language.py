"""language: a small decoder-only transformer (TinyGPT) trained on byte-level text made offline.

Built on the public :class:`~shoal.workloads.base.Workload` contract exactly as a user's workload
would be. ``--arch tiny|small|large`` picks the preset (:data:`~shoal.workloads.language_model.PRESETS`;
the trainer's default ``--arch`` means ``tiny``), ``--samples N`` the number of training windows of
``seq_len`` bytes (default 2,048; the test set is ``N // 8`` windows of the text that follows).

A sample is a window: ``(tokens[T], next tokens[T])``. The loss is the next-token cross-entropy over
every position of the batch. Every window has the same ``T`` tokens, so shoal's exact evaluation
(each batch's mean loss re-weighted by its number of windows, summed over ranks, divided by the
number of windows) gives ``test_loss`` = the exact mean next-token loss over every test token; the
per-batch sums of :meth:`Language.metrics` give the exact ``test_accuracy`` (next-byte arg-max
accuracy over every token) and ``test_bits_per_byte`` (``test_loss / ln 2``). The perplexity is
``exp(test_loss)`` (:func:`~shoal.workloads.language_model.perplexity`), computed from the exact mean,
never as a mean of per-batch perplexities.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from shoal.workloads.archs import TRAINER_DEFAULT_ARCH, check_arch
from shoal.workloads.base import Workload, WorkloadData, WorkloadSettings
from shoal.workloads.language_model import (
    PRESETS,
    TinyGPT,
    TokenWindows,
    lm_loss,
    perplexity,
    synthetic_corpus,
    tokenize,
)

DEFAULT_SAMPLES = 2048
"""Training windows when ``--samples`` is not given (64 KiB of text with the tiny preset)."""
CORPUS_SEED = 0
"""The text is fixed, whatever ``--seed`` says, so losses compare across runs."""


def preset_name(arch: str) -> str:
    """The preset ``--arch`` names (the trainer's default means ``tiny``); unknown: a ShoalError."""
    check_arch("language", arch)
    return "tiny" if arch == TRAINER_DEFAULT_ARCH else arch


def windows(n_train: int, n_test: int, seq_len: int) -> tuple[TokenWindows, TokenWindows]:
    """``n_train`` then ``n_test`` non-overlapping windows of the synthetic corpus, the test text after
    the training text (each set carries one extra token: the last window's last target)."""
    train_len, test_len = n_train * seq_len + 1, n_test * seq_len + 1
    tokens = tokenize(synthetic_corpus(train_len + test_len, CORPUS_SEED))
    return TokenWindows(tokens[:train_len], seq_len), TokenWindows(tokens[train_len:], seq_len)


def as_tensors(data: TokenWindows) -> tuple[torch.Tensor, torch.Tensor]:
    """All windows as ``(inputs[N, T], targets[N, T])``: item ``i`` of ``data`` is row ``i``."""
    n, t = len(data), data.seq_len
    return data.tokens[: n * t].view(n, t), data.tokens[1 : n * t + 1].view(n, t)


class Language(Workload):
    name = "language"
    summary = "a decoder-only transformer on byte-level English-like text made offline (--arch tiny|small|large)"
    defaults = {"epochs": 3, "batch_size": 32, "lr": 3e-3, "optimizer": "adamw", "weight_decay": 0.0}

    def prepare(self, cfg: WorkloadSettings) -> None:
        preset_name(cfg.arch)

    def load(self, cfg: WorkloadSettings, device: torch.device, rank: int = 0) -> WorkloadData:
        seq_len = PRESETS[preset_name(cfg.arch)].seq_len
        samples = cfg.samples or DEFAULT_SAMPLES
        train, test = windows(samples, max(1, samples // 8), seq_len)
        # The tensors' fast path: whole batches gathered at once (the same items as the datasets).
        return WorkloadData(
            train=tuple(x.to(device) for x in as_tensors(train)),
            test=tuple(x.to(device) for x in as_tensors(test)),
            num_classes=None,
        )

    def build_model(self, cfg: WorkloadSettings, num_classes: int | None) -> nn.Module:
        return TinyGPT.preset(preset_name(cfg.arch))

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The next-token cross-entropy, the mean over every position of the batch."""
        return lm_loss(outputs, targets)

    def metrics(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-window sums (each window's mean over its ``T`` positions): shoal divides by the number
        of windows, so the results are exact means over every test token."""
        t = targets.shape[1]
        correct = (outputs.argmax(dim=-1) == targets).sum().double() / t
        bits = lm_loss(outputs, targets, reduction="sum").double() / (t * math.log(2))
        return {"accuracy": correct, "bits_per_byte": bits}

    def derived_metrics(self, means: dict[str, float]) -> dict[str, float]:
        """``test_perplexity``: ``exp`` of the exact mean token loss (not a mean of per-batch values)."""
        return {"perplexity": perplexity(means["loss"])}
