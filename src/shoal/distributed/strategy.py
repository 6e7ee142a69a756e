"""How a model is spread over a job's processes (``--strategy``), checked without torch: the
strategies' names, FSDP's mixed-precision values, and what FSDP refuses. The config checks them
before torch loads (a wrong flag is said at once); :mod:`shoal.distributed.fsdp` and
:mod:`shoal.distributed.wrap` apply them."""

from __future__ import annotations

from shoal.errors import ShoalError, check_choice

STRATEGIES = ("ddp", "fsdp")
"""The names ``--strategy`` (and ``ctx.wrap(strategy=)``) accepts; ``ddp`` is the default."""

MIXED_PRECISION = ("off", "bf16")
"""``mixed_precision`` values: ``bf16`` computes with bf16 copies of the parameters and reduces
gradients in float32 (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``). fp16 is not
offered: it needs a loss scaler that FSDP2 does not provide (use bf16)."""


def check_strategy(name: str) -> str:
    """``name`` if it is a known strategy, else a :class:`ShoalError` listing them."""
    hint = f"pass --strategy {' or --strategy '.join(STRATEGIES)} (ddp replicates the model, fsdp shards it)"
    return check_choice("strategy", name, STRATEGIES, hint)


def refuse_comm_hook_with_fsdp(comm_hook: str | None, strategy: str = "fsdp") -> None:
    """Refuse a DDP gradient-compression hook (bf16, fp16, powersgd) under FSDP.

    DDP's comm hooks replace DDP's bucketed all-reduce; FSDP reduce-scatters gradients itself and has
    no such hook (its ``mixed_precision`` reduce dtype is the FSDP way to move fewer bytes).
    """
    if strategy == "fsdp" and comm_hook not in (None, "none"):
        raise ShoalError(
            f"--comm-hook {comm_hook} works only with --strategy ddp",
            "drop --comm-hook (FSDP reduce-scatters gradients itself), or use --strategy ddp",
        )
