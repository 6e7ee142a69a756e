"""Gradient compression for DDP: torch's communication hooks, chosen by name, their state checkpointable.

* ``bf16`` / ``fp16`` (``torch.distributed.algorithms.ddp_comm_hooks.default_hooks``): each gradient
  bucket is cast to bfloat16 / float16 before the all-reduce and back after it: half the bytes on the
  wire, at the cost of rounding the *averaged* gradient (parameters and optimizer stay float32). Both
  work with gloo (checked with torch 2.14.1 and 2.15 on CPU). No state.
* ``powersgd`` (``...ddp_comm_hooks.powerSGD_hook``, Vogels et al. 2019, https://arxiv.org/abs/1905.13727):
  each gradient matrix M (a weight's gradient viewed as rows x rest) is sent as two thin factors,
  P = M Q and Q = M^T P, of rank r (``rank``, default 2), so a 512x4608 convolution's 2.4 M floats
  travel as 2 x (512 + 4608) floats; vectors (biases, norms) and matrices too small to gain are
  all-reduced as they are. With *error feedback* (what the approximation missed is added to the next
  step's gradient, per rank) and *warm start* (each step's Q starts from the last one). The first
  ``start_iter`` steps use the plain all-reduce (torch's advice: about 10% of the run,
  :func:`powersgd_start`; at least 2, because DDP re-buckets the parameters after its first step).

Exact resume. PowerSGD's state (every rank's error feedback, the P and Q memories, the iteration
count) decides every later step, so :func:`register_comm_hook` returns a :class:`CommHook` with
``state_dict()`` / ``load_state_dict()``: a checkpoint's *per-rank* object (``shoal train`` saves it
with every checkpoint). torch keeps that state per DDP *bucket*, and DDP's buckets are not the same
in a resumed process: a fresh DDP model holds every parameter in one bucket during its first step and
re-buckets them after it (``DistributedDataParallel._compute_bucket_assignment_by_size`` with
``sys.maxsize`` first; ``Reducer::rebuild_buckets`` then), so the resumed run's first step would meet
state laid out for other buckets. :class:`PowerSGD` therefore keeps the state per *parameter* and
places it into whatever bucket holds each parameter just before torch's hook runs on that bucket
(only when the layout changed: in a steady run, never after the first PowerSGD step). Q starts from
a random matrix drawn per parameter from ``seed`` (torch draws one per bucket), so the start does not
depend on the bucket layout either: a resumed run ends bit-identical to an uninterrupted one.

``shoal bench scaling --comm-hook bf16,powersgd`` measures what each is worth (docs/BENCHMARKS.md,
"Scaling" and "Slow networks").

The package is laid out as torch's own ``ddp_comm_hooks``: this module chooses a hook by name; the
hooks (``powersgd``) and their common base (``base``) never import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shoal.distributed.comm_hooks.base import DEFAULT_POWERSGD_RANK, CommHook
from shoal.errors import ShoalError, check_choice

if TYPE_CHECKING:
    from torch import nn

COMM_HOOKS = ("none", "bf16", "fp16", "powersgd")
"""The names :func:`register_comm_hook` accepts."""

TORCH_POWERSGD_START = 1_000
"""torch's default ``start_powerSGD_iter``: what the library uses when no ``start_iter`` is given."""

__all__ = ["COMM_HOOKS", "DEFAULT_POWERSGD_RANK", "CommHook", "check_comm_hook", "powersgd_start", "register_comm_hook"]

_CASTS = {"bf16": ("bf16_compress_hook", "bfloat16"), "fp16": ("fp16_compress_hook", "float16")}


def check_comm_hook(name: str) -> str:
    """``name`` if it is a known hook name, else a :class:`ShoalError` listing the choices."""
    return check_choice(
        "communication hook", name, COMM_HOOKS, f"use one of: {', '.join(COMM_HOOKS)} (none: plain float32 all-reduce)"
    )


def check_powersgd_rank(rank: int) -> int:
    if rank < 1:
        raise ShoalError(f"--powersgd-rank must be at least 1, got {rank}", "pass --powersgd-rank 1, 2 or 4")
    return rank


def powersgd_start(total_steps: int) -> int:
    """The step PowerSGD starts at in a run of ``total_steps`` optimizer steps: 10% of the run, as
    torch's ``PowerSGDState`` documentation advises, and at least 2 (DDP re-buckets after step 1)."""
    return max(2, total_steps // 10)


def register_comm_hook(
    model: nn.Module,
    name: str,
    *,
    rank: int = DEFAULT_POWERSGD_RANK,
    start_iter: int | None = None,
    process_group: Any = None,
    seed: int = 0,
) -> CommHook:
    """Register torch's ``name`` gradient-compression hook on a DDP ``model``.

    Args:
        model: what :func:`shoal.apply_ddp` / ``ctx.wrap`` returned. A model that is not wrapped in
            DDP (one process: there is no gradient all-reduce to compress) is left unchanged.
        name: ``none`` (DDP's float32 all-reduce), ``bf16``, ``fp16`` or ``powersgd``.
        rank: ``powersgd``: the rank of each gradient matrix's approximation (1-4 typical; higher is
            closer to the exact gradient and sends more).
        start_iter: ``powersgd``: plain all-reduce for this many steps first (at least 2; default
            torch's 1000; :func:`powersgd_start` gives 10% of a run).
        process_group: the group DDP reduces over; default: the whole job.
        seed: ``powersgd``: seeds the initial Q matrices (the same on every rank).

    Returns:
        a :class:`CommHook`: its ``state_dict()`` is PowerSGD's per-rank state (empty for the others).

    Raises:
        ShoalError: for an unknown ``name``, a ``rank`` below 1 or a ``start_iter`` below 2.

    DDP accepts one hook per model: registering a second one raises torch's RuntimeError.
    """
    check_comm_hook(name)
    check_powersgd_rank(rank)
    if start_iter is not None and start_iter < 2:
        raise ShoalError(
            f"PowerSGD cannot start before step 2, got start_iter={start_iter}",
            "DDP re-buckets the parameters after its first step: pass start_iter=2 or more",
        )
    if name == "none":
        return CommHook(name, "plain float32 all-reduce", applied=False)
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        return CommHook(name, "unused (no DDP in a single process)", applied=False)
    if name == "powersgd":
        start = TORCH_POWERSGD_START if start_iter is None else start_iter
        from shoal.distributed.comm_hooks.powersgd import PowerSGD

        return PowerSGD(model, rank=rank, start_iter=start, process_group=process_group, seed=seed)
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    hook, dtype = _CASTS[name]
    # The hook's state is the process group (None: the default group, as torch's hooks expect).
    model.register_comm_hook(process_group, getattr(default_hooks, hook))
    return CommHook(name, f"gradients all-reduced in {dtype}", applied=True)
