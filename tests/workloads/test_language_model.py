"""The language model's building blocks: the offline corpus, its windows, TinyGPT, its presets and loss."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch

from shoal.workloads.language_model import (
    MEMORY_BUDGET,
    PRESETS,
    TinyGPT,
    TokenWindows,
    lm_loss,
    perplexity,
    synthetic_corpus,
    text_datasets,
    tokenize,
    training_state_bytes,
)


def test_the_corpus_is_deterministic_ascii_text_with_structure():
    text = synthetic_corpus(50_000)
    assert len(text) == 50_000 and text == synthetic_corpus(50_000)
    assert synthetic_corpus(50_000, seed=1) != text
    assert synthetic_corpus(4_000) == text[:4_000]  # a shorter corpus is a prefix of a longer one
    # Pinned: the same bytes on every machine and Python version (a 64-bit LCG, not `random`).
    assert hashlib.sha256(text).hexdigest()[:16] == "fade16cd430df022"
    assert text[:40] == b"A stranger follows seven stones near the"
    decoded = text.decode("ascii")
    assert decoded.count(". ") + decoded.count(".\n") > 700
    # Far from uniform bytes: a model has something to learn (empirical entropy < 4.5 bits/byte).
    counts = torch.bincount(tokenize(text), minlength=256).double()
    p = counts[counts > 0] / counts.sum()
    assert -(p * p.log2()).sum().item() < 4.5


def test_windows_are_inputs_and_next_tokens_and_the_split_is_disjoint():
    tokens = torch.arange(100)
    windows = TokenWindows(tokens, seq_len=8)
    assert len(windows) == 12  # (100 - 1) // 8
    x, y = windows[3]
    assert x.tolist() == list(range(24, 32)) and y.tolist() == list(range(25, 33))
    with pytest.raises(IndexError):
        windows[12]
    with pytest.raises(ValueError, match="too few"):
        TokenWindows(torch.arange(8), seq_len=8)
    train, test = text_datasets(seq_len=32, n_bytes=10_000)
    assert len(train) == (9_000 - 1) // 32 and len(test) == (1_000 - 1) // 32
    assert train[0][0].dtype == torch.int64 and int(train[0][0].max()) < 256


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_presets_build_the_counted_parameters(name):
    model = TinyGPT.preset(name)
    assert sum(p.numel() for p in model.parameters()) == PRESETS[name].n_params
    assert len(model.blocks) == PRESETS[name].n_layers


def test_the_large_preset_exceeds_the_budget_under_ddp_at_4_ranks_but_fits_under_fsdp():
    n = PRESETS["large"].n_params
    assert n == 99_821_824
    assert training_state_bytes(n, "ddp", 4) == 16 * n > MEMORY_BUDGET
    assert training_state_bytes(n, "fsdp", 4) == 4 * n < MEMORY_BUDGET
    assert training_state_bytes(n, "fsdp", 3) == -(-16 * n // 3)


def test_the_model_is_causal_and_learns():
    torch.manual_seed(0)
    model = TinyGPT.preset("tiny")
    x = torch.randint(0, 256, (2, 32))
    logits = model(x)
    assert logits.shape == (2, 32, 256)
    changed = x.clone()
    changed[:, 20] = (changed[:, 20] + 1) % 256
    # Changing token 20 changes no prediction before it.
    assert torch.equal(model(changed)[:, :20], logits[:, :20])
    loss = lm_loss(logits, x)
    assert loss.item() == pytest.approx(math.log(256), rel=0.01)  # small initial weights: near uniform
    assert perplexity(loss.item()) == pytest.approx(256, rel=0.05)
    train, _ = text_datasets(seq_len=32, n_bytes=5_000)
    batch_x, batch_y = (torch.stack(t) for t in zip(*(train[i] for i in range(8))))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    first = None
    for _ in range(30):
        loss = lm_loss(model(batch_x), batch_y)
        first = first if first is not None else loss.item()
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert loss.item() < first - 2.0
