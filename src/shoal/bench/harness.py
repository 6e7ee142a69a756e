"""One pipeline for every benchmark: config -> measure -> rows and notes -> report -> table, JSON, plot.

A benchmark module declares only what is its own and hands it over as one :class:`Benchmark`: its
frozen config dataclass (a docstring under each field: ``shoal bench NAME --help`` is generated from
them), the tiny sizes of ``--smoke``, ``measure(cfg, log)`` returning :class:`Measured`, the lines of
its text form and the drawing of its plot. The rest is done here, once: ``--smoke`` (tiny sizes, any
option given explicitly still wins), the report's common head (:mod:`shoal.bench.report`), the text
form's header and notes, ``--json PATH`` with a PNG beside it, and ``--plot PATH``. The project's
own measurements beside the package (``benchmarks/``, ``python -m benchmarks.NAME``) go through the
same pipeline.

Helpers the benchmarks share: :func:`paired_ratios` (comparisons paired by round), :func:`launch_workers`
(shoal's own launcher), :func:`require_at_least` (config checks) and :func:`flag` (a field whose
command-line flag is spelled or parsed otherwise than its type says). Nothing here imports torch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from shoal.bench import report as rep
from shoal.bench.timing import load_average, median
from shoal.errors import ShoalError

Log = Callable[[str], None]


@dataclass
class Measured:
    """What a benchmark's ``measure`` hands back: its rows, its notes and the rest of its report."""

    rows: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    """Rows skipped and why, verdicts: printed under the table and kept in the JSON."""
    config: dict[str, Any] = field(default_factory=dict)
    """Values resolved while measuring (world sizes, start method, ...): they replace or extend the
    config's fields in the report."""
    device: str | None = None
    """The device type measured, named in the report's machine facts (default: cpu)."""
    meta: dict[str, Any] = field(default_factory=dict)
    """More facts about the run itself, such as ``load_averages`` sampled while it ran."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Other top-level keys of the report (``summary``, ``weights``, ``verdict``, ...)."""


@dataclass(frozen=True)
class Flag:
    """A config field's command-line flag, where its type alone does not say it (see :func:`flag`)."""

    name: str | None = None
    """The flag's spelling, when not ``--field-name`` (``--dir`` for ``directory``)."""
    parse: Callable[[str], Any] | None = None
    """Turns the text into the field's value, raising ``argparse.ArgumentTypeError`` when it cannot."""
    metavar: str | None = None
    default: str | None = None
    """The default as the help shows it (``4K`` rather than ``4096``)."""


def flag(**options: Any) -> dict[str, Flag]:
    """``dataclasses.field`` metadata for a field whose flag is spelled or parsed otherwise, e.g.
    ``field(default=4096, metadata=flag(parse=parse_size, default="4K"))`` (read by shoal.cli.bench)."""
    return {"flag": Flag(**options)}


@dataclass(frozen=True)
class Benchmark:
    """One benchmark, as the harness and its command line (``shoal bench NAME``) see it."""

    name: str
    config: type
    """The frozen config dataclass; its ``__post_init__`` refuses bad values with a ShoalError."""
    smoke: Mapping[str, Any]
    """The config values of ``--smoke``: tiny sizes that check the machinery in seconds."""
    measure: Callable[[Any, Log], Measured]
    text: Callable[[dict[str, Any]], list[str]]
    """The lines of the text form between the common header and the notes (what was run, the table)."""
    draw: Callable[[Any, dict[str, Any]], None]
    """Draws the report on matplotlib axes (the harness adds the grid and saves the PNG)."""
    description: str
    """What ``shoal bench NAME --help`` says before the flags (its one-line summary is in
    :data:`shoal.bench.BENCHMARKS`)."""
    examples: str
    """The end of ``shoal bench NAME --help``: worked examples."""
    command: str = ""
    """The command that runs it, as its log and ``--help`` name it: ``shoal bench NAME`` (the default),
    or ``python -m benchmarks.NAME`` for the project's own measurements beside the package."""

    def __post_init__(self) -> None:
        if not self.command:
            object.__setattr__(self, "command", f"shoal bench {self.name}")

    def configure(self, *, smoke: bool = False, **given: Any) -> Any:
        """The config: its defaults, or ``--smoke``'s tiny sizes, with every value ``given`` winning."""
        return self.config(**{**(self.smoke if smoke else {}), **given})

    def run(self, cfg: Any, *, log: Log = print, argv: Sequence[str] | None = None) -> dict[str, Any]:
        """Measure; return the report (a plain dict: what ``--json`` writes)."""
        load_start, started = load_average(), rep.now()
        measured = self.measure(cfg, log)
        report = rep.new_report(
            self.name,
            {**asdict(cfg), **measured.config},
            device=measured.device,
            argv=argv,
            load_start=load_start,
            started=started,
        )
        report["meta"].update(measured.meta)
        report["notes"] += measured.notes
        report["rows"] = measured.rows
        report.update(measured.extra)
        return rep.finish_report(report)

    def format(self, report: dict[str, Any]) -> str:
        """The terminal form: the command and machine, the benchmark's own lines, then the notes."""
        return "\n".join([rep.header(report), *self.text(report), *(f"- {note}" for note in report["notes"])])

    def plot(self, report: dict[str, Any], path: str | Path) -> tuple[Path | None, str | None]:
        """The PNG at ``path``: ``(path, None)``, or ``(None, note)`` without matplotlib."""
        return rep.save_plot(path, lambda ax: self.draw(ax, report))


def run_and_write(
    bench: Benchmark,
    cfg: Any,
    *,
    smoke: bool = False,
    json_path: str | None = None,
    plot_path: str | None = None,
    argv: Sequence[str] | None = None,
    log: Log | None = None,
) -> dict[str, Any]:
    """What ``shoal bench NAME`` (or ``bench.command``) does: run, print the table, write the JSON and the plot.

    The plot goes to ``plot_path``, or beside ``json_path`` as a PNG. Progress goes to ``log``
    (stderr by default), the table to stdout.
    """
    log = log or _stderr
    log(f"{bench.command}{' (smoke: tiny sizes, the numbers mean nothing)' if smoke else ''}")
    report = bench.run(cfg, log=log, argv=argv)
    report["config"]["smoke"] = bool(smoke)
    plot_path = plot_path or (str(Path(json_path).with_suffix(".png")) if json_path else None)
    if plot_path:
        written, note = bench.plot(report, plot_path)
        report["plot"] = str(written) if written else None
        if note:
            report["notes"].append(note)
    print(bench.format(report), flush=True)
    if json_path:
        path = rep.write_json(json_path, report)
        log(f"wrote {path}" + (f" and {report['plot']}" if report.get("plot") else ""))
    elif report.get("plot"):
        log(f"wrote {report['plot']}")
    return report


def paired_ratios(
    values: Mapping[Any, float] | Sequence[float], base: Mapping[Any, float] | Sequence[float]
) -> list[float]:
    """``values[k] / base[k]`` for every round (or launch) ``k`` measured in both.

    Sequences pair by position, mappings by key (a round that failed on one side is left out). Two
    figures of the same round saw the same spell of a shared machine: the median of their ratios
    is steadier than the ratio of the medians.
    """
    a = values if isinstance(values, Mapping) else dict(enumerate(values))
    b = base if isinstance(base, Mapping) else dict(enumerate(base))
    return [a[k] / b[k] for k in a if k in b]


def paired_ratio(values: Mapping[Any, float] | Sequence[float], base: Mapping[Any, float] | Sequence[float]) -> float:
    """The median of :func:`paired_ratios` (NaN when no round has both)."""
    return median(paired_ratios(values, base))


def launch_workers(entrypoint: Callable[..., Any], args: tuple[Any, ...], nproc: int, start_method: str) -> Any:
    """``nproc`` workers running ``entrypoint(*args)`` through shoal's launcher; rank 0's return value."""
    from shoal.launch.local import launch_local

    return launch_local(entrypoint, args, nproc, start_method=start_method)[0]


def require_at_least(cfg: Any, minimum: int, *names: str) -> None:
    """Raise a ShoalError naming the flag (``--batch-size``) of the first field below ``minimum``."""
    for name in names:
        value = getattr(cfg, name)
        if value < minimum:
            flag = "--" + name.replace("_", "-")
            floor = "at least 1" if minimum == 1 else f"{minimum} or more"
            raise ShoalError(f"{flag} must be {floor}, got {value}", f"pass {flag} {minimum} or more")


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
