"""What ``shoal.horovod`` does not offer, each named in one line with shoal's equivalent.

Used at the point of use: ``op=hvd.Adasum`` fails where it is passed, ``hvd.elastic.run`` where it
is looked up, ``hvd.start_timeline()`` where it is called, and any other Horovod name this module
lists when the script reaches for it (the facade's ``__getattr__``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import NoReturn

from shoal.horovod.errors import HorovodMissingName, HorovodUnsupported

DOCS = "docs/HOROVOD.md"

ELASTIC_HINT = (
    "restart failed workers with torch's elastic agent (`shoal run --max-restarts K train.py`, or "
    "`shoal train ... --max-restarts K`) and resume from a checkpoint (shoal's ctx.checkpointer(...).resume(...)); "
    f"see {DOCS}"
)

UNSUPPORTED_NAMES: dict[str, tuple[str, str]] = {
    # Horovod name -> (what it is, shoal's equivalent)
    "SyncBatchNorm": (
        "Horovod's SyncBatchNorm",
        "use torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) (CUDA/NCCL only in torch)",
    ),
    "ProcessSet": ("process sets", "use torch.distributed.new_group(ranks) and torch.distributed's collectives"),
    "add_process_set": ("process sets", "use torch.distributed.new_group(ranks)"),
    "remove_process_set": ("process sets", "use torch.distributed.destroy_process_group(group)"),
}


def missing_name(name: str) -> HorovodMissingName:
    """The error for ``hvd.<name>`` that shoal.horovod does not have, with the equivalent when known."""
    if name in UNSUPPORTED_NAMES:
        what, equivalent = UNSUPPORTED_NAMES[name]
        return HorovodMissingName(f"hvd.{name}: {what} is not supported by shoal.horovod", equivalent)
    return HorovodMissingName(
        f"hvd.{name} is not part of shoal.horovod", f"{DOCS} lists the Horovod API shoal.horovod offers"
    )


def facade_getattr(name: str) -> NoReturn:
    """The facades' module ``__getattr__``: a Horovod name they do not offer is one line naming it."""
    if name.startswith("__"):
        raise AttributeError(name)
    raise missing_name(name)


def adasum(where: str) -> HorovodUnsupported:
    return HorovodUnsupported(
        f"{where}: Adasum is not supported by shoal.horovod",
        "use op=hvd.Average with the learning rate scaled by hvd.size() and a warm-up "
        "(shoal train: --lr-scaling linear --warmup-epochs N)",
    )


def timeline(where: str) -> HorovodUnsupported:
    return HorovodUnsupported(
        f"{where}: Horovod's timeline is not supported by shoal.horovod",
        "profile with torch.profiler (prof.export_chrome_trace(path) writes the same Chrome trace format); "
        "unset HOROVOD_TIMELINE",
    )


def process_sets(where: str) -> HorovodUnsupported:
    return HorovodUnsupported(
        f"{where}: process sets are not supported by shoal.horovod (every call spans the whole job)",
        "drop the process_set argument, or use torch.distributed.new_group(ranks) for a subgroup",
    )


HONOURED_SETTINGS = frozenset({"HOROVOD_FUSION_THRESHOLD"})
"""Horovod environment settings shoal.horovod acts on (the fusion threshold sizes the gradient buckets)."""


def ignored_settings(environ: Mapping[str, str] | None = None) -> list[str]:
    """The ``HOROVOD_*`` variables set (non-empty) that shoal.horovod does not act on, sorted.

    Horovod tunes its own engine with them (``HOROVOD_TIMELINE``, ``HOROVOD_CYCLE_TIME``,
    ``HOROVOD_AUTOTUNE``, ``HOROVOD_HIERARCHICAL_ALLREDUCE``, ...); torch.distributed has no such
    knobs, so a script that sets them still runs, only without their effect.
    """
    env = os.environ if environ is None else environ
    return sorted(k for k, v in env.items() if k.startswith("HOROVOD_") and v and k not in HONOURED_SETTINGS)


def warn_ignored_settings(names: list[str]) -> None:
    """One line on stderr naming the ignored settings (the caller decides which rank says it)."""
    if not names:
        return
    shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    why = (
        "profile with torch.profiler instead of the timeline; "
        if any(n.startswith("HOROVOD_TIMELINE") for n in names)
        else ""
    )
    print(
        f"shoal: warning: shoal.horovod ignores {shown} (Horovod engine settings torch.distributed has no "
        f"equivalent for); {why}see {DOCS}",
        file=sys.stderr,
        flush=True,
    )


def start_timeline(file_path: str = "", mark_cycles: bool = False) -> NoReturn:
    """Horovod's timeline: not offered (see :func:`timeline`)."""
    raise timeline("hvd.start_timeline()")


def stop_timeline() -> NoReturn:
    """Horovod's timeline: not offered (see :func:`timeline`)."""
    raise timeline("hvd.stop_timeline()")


class _Elastic:
    """``hvd.elastic``: every name in it (``run``, ``TorchState``, ...) fails with shoal's equivalent."""

    def __getattr__(self, name: str) -> NoReturn:
        if name.startswith("__"):
            raise AttributeError(name)
        raise HorovodUnsupported(f"hvd.elastic.{name}: Horovod's elastic training is not supported", ELASTIC_HINT)

    def __repr__(self) -> str:
        return "<hvd.elastic: not supported by shoal.horovod>"


elastic = _Elastic()
