"""What every benchmark report shares: machine facts, text tables, JSON files and optional plots.

A report is a plain dict (what ``--json`` writes): ``benchmark``, ``meta`` (command, date, machine,
load), ``config`` (the sizes measured), the benchmark's rows, and ``notes`` (rows skipped and why,
verdicts); :class:`shoal.bench.harness.Benchmark` assembles it. Plots need matplotlib
(``pip install 'shoal[bench]'``); without it the plot is skipped with a note, never an error.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from shoal.atomic import atomic_write_text
from shoal.bench.timing import load_average
from shoal.env.host import usable_cores


def machine_info(device: Any = None) -> dict[str, Any]:
    """Cores, CPU model, memory, Python/torch versions and the GPU (if the run used one)."""
    import torch

    info: dict[str, Any] = {
        "cores": usable_cores(),
        "cpu": _cpu_model(),
        "memory_gib": _memory_gib(),
        "os": platform.platform(terse=True),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": str(device) if device is not None else "cpu",
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    try:
        from shoal import __version__

        info["shoal"] = __version__
    except ImportError:  # pragma: no cover
        pass
    return info


def new_report(
    benchmark: str,
    config: dict[str, Any],
    *,
    device: Any = None,
    argv: Sequence[str] | None = None,
    load_start: float | None = None,
    started: str | None = None,
) -> dict:
    """The common head of a report; the benchmark adds its rows and notes.

    A benchmark that builds its report after measuring passes ``load_start`` and ``started``
    (from :func:`load_average` and :func:`now`) taken before it began.
    """
    argv = list(sys.argv if argv is None else argv)
    return {
        "benchmark": benchmark,
        "meta": {
            "command": command_line(argv),
            "date": started or now(),
            "machine": machine_info(device),
            "load_average_start": load_start if load_start is not None else load_average(),
        },
        "config": dict(config),
        "notes": [],
    }


def now() -> str:
    """The UTC date and time, to the second (ISO 8601)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def finish_report(report: dict) -> dict:
    """Record the load average at the end (a busy machine makes numbers noisy)."""
    report["meta"]["load_average_end"] = load_average()
    return report


def command_line(argv: Sequence[str]) -> str:
    """``argv`` as the ``shoal ...`` command a reader can paste (``python -m shoal`` included)."""
    argv = list(argv)
    if argv and (argv[0].endswith("shoal") or argv[0].endswith("__main__.py")):
        argv = ["shoal", *argv[1:]]
    return shlex.join(argv)


def header(report: dict) -> str:
    """Two lines: the command and the machine it ran on, with the load (noise) it saw."""
    meta = report["meta"]
    m = meta["machine"]
    load = meta.get("load_average_start")
    load_end = meta.get("load_average_end")
    busy = ""
    if load is not None:
        busy = f" | load avg {load:.2f}" + (f" -> {load_end:.2f}" if load_end is not None else "")
        # The benchmark's own processes count too (2 workers on 2 cores: load ~2); only more
        # runnable work than cores means others competed for them.
        if max(load, load_end or 0.0) > m["cores"] + 0.5:
            busy += " (machine busy: numbers are noisy)"
    gpus = f" | {', '.join(m['gpus'])}" if m.get("gpus") else ""
    return (
        f"{meta['command']}\n"
        f"{m['cores']} cores ({m['cpu']}) | torch {m['torch']} | {m['device']}{gpus} | {meta['date']}{busy}"
    )


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, align: str | None = None) -> str:
    """A plain text table; ``align`` is one ``l``/``r`` per column (default: first left, rest right)."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    align = align or "l" + "r" * (len(headers) - 1)

    def line(row: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(row, widths, align)).rstrip()

    out = [line(cells[0]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def write_json(path: str | os.PathLike, report: dict) -> Path:
    """Write ``report`` to ``path`` atomically (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, json.dumps(_jsonable(report), indent=2, allow_nan=False) + "\n")


def save_plot(path: str | os.PathLike, draw: Callable[[Any], None]) -> tuple[Path | None, str | None]:
    """Draw a figure with ``draw(axes)`` into the PNG ``path``.

    Returns ``(path, None)``, or ``(None, note)`` when matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        return None, "plot skipped: matplotlib is not installed (pip install 'shoal[bench]')"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    try:
        draw(ax)
        _values_from_zero(ax)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path, None


def _values_from_zero(ax: Any) -> None:
    """Start the axis that holds values at zero (ratios read true only from there), when it is linear.

    That is y, or x for horizontal bars (their y holds categories: clipping it would hide bars).
    """
    if ax.yaxis.units is None:
        if ax.get_yscale() == "linear":
            ax.set_ylim(bottom=0)
    elif ax.get_xscale() == "linear":
        ax.set_xlim(left=0)


def runs_chart(
    value: str, runs: str, xlabel: str, title: Callable[[dict[str, Any]], str]
) -> Callable[[Any, dict], None]:
    """A benchmark's ``draw``: one horizontal bar per row (its median ``value``) with a dot per run
    (the list ``runs``), so the spread shows; ``title`` is made from the report's config."""

    def draw(ax: Any, report: dict[str, Any]) -> None:
        rows = report["rows"]
        ax.barh([r["variant"] for r in rows], [r[value] for r in rows])
        for i, r in enumerate(rows):
            ax.plot(r[runs], [i] * len(r[runs]), "k.", markersize=4)
        ax.invert_yaxis()
        ax.set_xlabel(xlabel)
        ax.set_title(title(report["config"]))

    return draw


# Numbers: formatting and parsing -----------------------------------------------------------------


def rate(value: float) -> str:
    """1234567 -> '1.23M', 4887 -> '4,887', 97.13 -> '97.1'."""
    if value != value:
        return "n/a"
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:.1f}"


def size(nbytes: float) -> str:
    """4096 -> '4 KB', 268435456 -> '256 MB' (binary units, as nccl-tests prints sizes)."""
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{nbytes:.0f} B"


_UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "M": 2**20, "MB": 2**20, "G": 2**30, "GB": 2**30}


def parse_size(text: str) -> int:
    """'4K' -> 4096, '256M' -> 268435456, '1G', '4096': the inverse of :func:`size` (for flags)."""
    raw = text.strip().upper()
    number = raw.rstrip("KMGB")
    unit = raw[len(number) :]
    try:
        value = float(number) * _UNITS[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"expected a size such as 4096, 4K, 256M or 1G, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"a size must be at least 1 byte, got {text!r}")
    return int(value)


def parse_int_list(text: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4) (for flags; the error names the form expected)."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 1,2,4, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number, e.g. 1,2")
    return values


def less_time(reduction: float) -> str:
    """0.496 -> '49.6% less time'; -0.2 -> '20.0% more time'."""
    if reduction != reduction:
        return "n/a"
    if abs(reduction) < 5e-4:
        return "same time"
    return f"{abs(reduction) * 100:.1f}% {'less' if reduction > 0 else 'more'} time"


# Internals ---------------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """NaN/inf become None (JSON has no NaN); tuples become lists; paths become strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError):
        pass
    return None
