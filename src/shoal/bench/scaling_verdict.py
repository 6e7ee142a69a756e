"""The verdict of ``shoal bench scaling``: which bottleneck limits a world size, and which hook to use.

Pure functions of the summaries :mod:`shoal.bench.scaling` derives (efficiency, the no-all-reduce
control, hook gains); kept apart so the rules can be read and tested without launching anything.
"""

from __future__ import annotations

from typing import Any

HOOK_WORTH_IT = 0.05
"""A hook is recommended when it gains at least this much throughput (paired) over plain DDP."""


def verdict(
    n: int, s: dict[str, Any], model: dict[str, int] | None = None, rank: int = 2, *, advise: bool = True
) -> tuple[str, str]:
    """``(bound, sentence)`` for the ``n``-process summary ``s``: what limits scaling and what to do.

    ``bound`` is ``scales well``, ``communication-bound`` or ``contention-bound`` (or unknown without
    the no-all-reduce control); ``model`` (float counts, plain and PowerSGD) lets the advice quote
    how much PowerSGD of ``rank`` would send. ``advise=False`` (``--smoke``) leaves the advice out.
    """
    eff = s["efficiency"]
    text = f"{n} processes: efficiency {eff:.2f}"
    if "efficiency_no_allreduce" not in s:
        bound = "scales well" if eff >= 0.9 else "unknown (run without --no-controls to see why)"
        return bound, f"{text}; {bound}{_hook_advice(s, bound, model, rank) if advise else ''}"
    ctl, share = s["efficiency_no_allreduce"], s["allreduce_share"]
    # efficiency = control x (1 - share): the job is slowed 1/control-fold by contention and
    # 1/(1 - share)-fold by waiting for the all-reduce; the larger factor is the bottleneck.
    by_comm, by_contention = 1.0 / max(1.0 - share, 1e-9), 1.0 / max(ctl, 1e-9)
    # A control slower than the job itself means the all-reduce cost is below the run-to-run noise.
    cost = (
        f"{share:.0%} of each step waits for the gradient all-reduce"
        if share >= 0.01
        else f"the gradient all-reduce costs less than the noise ({share:+.0%})"
    )
    if eff >= 0.9:
        bound, why = "scales well", cost
    elif by_comm >= by_contention:
        bound = "communication-bound"
        why = f"communication-bound: {cost} ({ctl:.2f} efficiency without it)"
    else:
        bound = "contention-bound"
        why = (
            f"compute contention: the processes slow each other down ({ctl:.2f} efficiency even "
            f"without all-reduce); {cost}"
        )
    extra = ""
    for hook, gain in s.get("hook_gains", {}).items():
        extra += f"; {hook} hook: {gain:+.1%} throughput (efficiency {s['efficiency_hooks'][hook]:.2f})"
    if "settings_gain" in s:
        extra += (
            f"; shoal's DDP settings: {s['settings_gain']:+.1%} throughput over torch's defaults "
            f"(efficiency {s['efficiency_torch_defaults']:.2f} with those)"
        )
    if "processes_vs_threads" in s:
        extra += f"; {n} processes give {s['processes_vs_threads']:.2f}x the throughput of 1 process with {n}x threads"
    return bound, f"{text}, {why}{extra}{_hook_advice(s, bound, model, rank) if advise else ''}"


def _hook_advice(s: dict[str, Any], bound: str, model: dict[str, int] | None, rank: int) -> str:
    """Which hook to use, from the hooks measured; for a communication-bound job without any, which to try."""
    gains = s.get("hook_gains", {})
    if gains:
        best = max(gains, key=gains.get)
        if gains[best] >= HOOK_WORTH_IT:
            return f". Use --comm-hook {best}: {gains[best]:+.0%} throughput here"
        return ". No hook pays here (none gains 5%): keep the plain all-reduce"
    if bound != "communication-bound":
        return ""
    sent = ""
    if model and model.get("floats"):
        sent = f", rank {rank} sends {model['powersgd_floats'] / model['floats']:.1%} of the float32 gradient bytes"
    return (
        f". Try --comm-hook powersgd (low-rank, error feedback{sent}) or bf16 (half the bytes): "
        "measure them with --comm-hook bf16,powersgd"
    )
