"""Building blocks of a small decoder-only language model: the model, its text, its datasets, its loss.

The pieces are what the bundled ``language`` workload (:mod:`shoal.workloads.language`), the FSDP
tests and ``benchmarks/memory.py`` use.

The text is made offline and deterministically (no download, nothing large committed): a synthetic
English-like corpus of sentences drawn from a small fixed grammar by a seeded 64-bit linear
congruential generator (not Python's ``random``, so the bytes are the same on every Python version).
It has real structure (agreement, word order, recurring phrases), so a model's loss falls well below
the uniform ``ln 256``, and it is tokenized byte-level: the vocabulary is the 256 byte values, no
tokenizer file needed.

The model is GPT-2-shaped (pre-LayerNorm blocks of causal self-attention and a 4x MLP, learned
position embeddings, untied head), its blocks in ``model.blocks`` (an ``nn.ModuleList``) so that
:func:`shoal.distributed.fsdp.apply_fsdp` shards one block at a time. No dropout: two runs from the
same seed compute the same thing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

VOCAB = 256
"""Byte-level: one token per byte."""

ADAM_BYTES_PER_PARAM = 16
"""Training state per float32 parameter with Adam: the parameter, its gradient, two moments (4 B each)."""


@dataclass(frozen=True)
class GPTConfig:
    """The shape of a :class:`TinyGPT`."""

    d_model: int
    n_layers: int
    n_heads: int
    seq_len: int
    vocab: int = VOCAB

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not a multiple of n_heads {self.n_heads}")

    @property
    def n_params(self) -> int:
        """The parameter count of the model this config builds (checked against the model in the tests)."""
        d = self.d_model
        block = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
        return self.vocab * d + self.seq_len * d + self.n_layers * block + 2 * d + d * self.vocab + self.vocab


PRESETS = {
    "tiny": GPTConfig(d_model=32, n_layers=2, n_heads=2, seq_len=32),
    "small": GPTConfig(d_model=256, n_layers=4, n_heads=4, seq_len=128),
    "large": GPTConfig(d_model=768, n_layers=14, n_heads=12, seq_len=256),
}
"""Sizes: ``tiny`` (43 K parameters: tests), ``small`` (3.3 M: benchmarks on a CPU), ``large``
(99.8 M: 1.6 GB = 1.49 GiB of Adam training state, over :data:`MEMORY_BUDGET` per worker under DDP, a quarter of
it per worker under FSDP at 4 ranks)."""

MEMORY_BUDGET = 1 << 30
"""The per-worker budget the ``large`` preset is sized against: 1 GiB of parameters, gradients and
optimizer state."""


def training_state_bytes(n_params: int, strategy: str, world_size: int) -> int:
    """Per-rank bytes of float32 parameters + gradients + Adam moments: DDP replicates all of it,
    FSDP holds a 1/N shard (rounded up; activations and temporary all-gathered blocks not counted)."""
    total = ADAM_BYTES_PER_PARAM * n_params
    return total if strategy == "ddp" else -(-total // world_size)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: causal self-attention, then a 4x GELU MLP, each residual."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    """A decoder-only transformer: ``forward(tokens[B, T]) -> logits[B, T, vocab]``."""

    def __init__(
        self, vocab: int = VOCAB, d_model: int = 32, n_layers: int = 2, n_heads: int = 2, seq_len: int = 32
    ) -> None:
        super().__init__()
        self.config = GPTConfig(d_model=d_model, n_layers=n_layers, n_heads=n_heads, seq_len=seq_len, vocab=vocab)
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        self.apply(_init)

    @classmethod
    def preset(cls, name: str) -> TinyGPT:
        cfg = PRESETS[name]
        return cls(cfg.vocab, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.seq_len)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok(tokens) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def _init(module: nn.Module) -> None:
    # GPT-2's initialisation: small normal weights, zero biases.
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy (``targets`` are the inputs shifted by one token)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), reduction=reduction)


def perplexity(mean_loss: float) -> float:
    """``exp`` of the mean next-token loss (nats): the effective number of equally likely next bytes."""
    return math.exp(mean_loss)


# -- the text ------------------------------------------------------------------------------------

_SUBJECTS = (
    "the fox", "a sailor", "the old miller", "my sister", "the river", "a small bird", "the captain",
    "the baker", "a stranger", "the children", "the lighthouse keeper", "an engineer",
)  # fmt: skip
_VERBS = (
    "watches", "carries", "finds", "remembers", "paints", "follows", "builds", "mends", "counts",
    "sells", "hides", "opens",
)  # fmt: skip
_OBJECTS = (
    "the boat", "a lantern", "seven stones", "the bread", "an old map", "the north wind", "a red door",
    "the harbour", "twelve letters", "the garden wall", "a silver key", "the evening bell",
)  # fmt: skip
_PLACES = (
    "by the sea", "before dawn", "in the village", "under the bridge", "after the storm",
    "near the mill", "every morning", "at the market",
)  # fmt: skip
_LINKS = (", and then ", " because ", " while ", ", but ")


class _Lcg:
    """Knuth's MMIX 64-bit linear congruential generator: the same stream on every platform."""

    def __init__(self, seed: int) -> None:
        self.state = (seed * 2862933555777941757 + 3037000493) % (1 << 64)

    def below(self, n: int) -> int:
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        return (self.state >> 33) % n


def synthetic_corpus(n_bytes: int = 200_000, seed: int = 0) -> bytes:
    """``n_bytes`` of English-like ASCII text from a fixed grammar, the same for the same seed."""
    rng = _Lcg(seed)
    pick = lambda words: words[rng.below(len(words))]  # noqa: E731
    parts: list[str] = []
    size = 0
    while size < n_bytes:
        sentence = f"{pick(_SUBJECTS)} {pick(_VERBS)} {pick(_OBJECTS)} {pick(_PLACES)}"
        if rng.below(3) == 0:
            sentence += f"{pick(_LINKS)}{pick(_SUBJECTS)} {pick(_VERBS)} {pick(_OBJECTS)}"
        sentence = sentence[0].upper() + sentence[1:] + (".\n" if rng.below(4) == 0 else ". ")
        parts.append(sentence)
        size += len(sentence)
    return "".join(parts).encode("ascii")[:n_bytes]


def tokenize(text: bytes) -> torch.Tensor:
    """Byte-level tokens (int64, one per byte)."""
    return torch.frombuffer(bytearray(text), dtype=torch.uint8).to(torch.int64)


class TokenWindows(Dataset):
    """Non-overlapping windows of ``seq_len`` tokens: item ``i`` is ``(x, y)``, ``y`` = ``x`` shifted by one."""

    def __init__(self, tokens: torch.Tensor, seq_len: int) -> None:
        if tokens.numel() < seq_len + 1:
            raise ValueError(f"{tokens.numel()} tokens are too few for one window of {seq_len} + 1")
        self.tokens, self.seq_len = tokens, seq_len

    def __len__(self) -> int:
        return (self.tokens.numel() - 1) // self.seq_len

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        start = index * self.seq_len
        chunk = self.tokens[start : start + self.seq_len + 1]
        return chunk[:-1], chunk[1:]


def text_datasets(
    seq_len: int, n_bytes: int = 200_000, test_fraction: float = 0.1, seed: int = 0
) -> tuple[TokenWindows, TokenWindows]:
    """Train and test windows of the synthetic corpus: its first ``1 - test_fraction``, then the rest."""
    tokens = tokenize(synthetic_corpus(n_bytes, seed))
    split = int(tokens.numel() * (1 - test_fraction))
    return TokenWindows(tokens[:split], seq_len), TokenWindows(tokens[split:], seq_len)
