"""``shoal bench scaling|allreduce``: measured numbers, as a table, JSON and a plot.

Each benchmark's flags are generated from its config dataclass (:mod:`shoal.cli.fields`: a field is a
flag, its docstring the help); the description and examples come from the benchmark's ``BENCHMARK``
and :func:`shoal.bench.harness.run_and_write` does the rest. ``--smoke`` starts from tiny sizes
(seconds; the numbers mean nothing) and any flag given explicitly still wins. :func:`main` gives
the project's own measurements beside the package (``python -m benchmarks.NAME``) the same command line.

A benchmark's parser is filled in only when that benchmark is named: ``shoal --help`` and
``shoal bench --help`` import no benchmark module, and no path here imports torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from typing import Any

from shoal.cli.fields import add_fields, field_docs, flag_name, given_fields
from shoal.cli.parser import ArgumentParser, HelpFormatter
from shoal.console import help_text as help_style
from shoal.errors import ShoalError

EXAMPLES = """\
examples:
  shoal bench scaling                            # ResNet-18 32x32 on 1..cores processes, controls
  shoal bench scaling --comm-hook bf16,powersgd  # what gradient compression is worth on this link
  shoal bench allreduce --nproc 2                # 4 KB .. 256 MB all-reduce vs memcpy
  shoal bench scaling --smoke --json out.json    # seconds; also out.png (with matplotlib)
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    from shoal.bench import BENCHMARKS

    parser = subparsers.add_parser(
        "bench",
        help="benchmarks: scaling over processes or nodes, all-reduce bandwidth (tables, JSON, plots)",
        description="Measure how well a job scales over processes or nodes on this machine or cluster, and why "
        "not better. Every figure is measured in the same run as its baseline.",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    parser.set_defaults(func=lambda args: _help(parser))
    benches = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", parser_class=_BenchmarkParser)
    for name, summary in BENCHMARKS.items():
        benches.add_parser(name, help=summary, benchmark=name, formatter_class=HelpFormatter)


class _BenchmarkParser(ArgumentParser):
    """The parser of one benchmark, filled in from its ``BENCHMARK`` the first time it is used
    (parsing or help): importing every benchmark and reading its fields' docstrings would cost
    ``shoal --help`` about 0.1 s."""

    def __init__(self, *args: Any, benchmark: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._unfilled = benchmark

    def _fill(self) -> None:
        if self._unfilled is None:
            return
        from shoal.bench import benchmark

        bench, self._unfilled = benchmark(self._unfilled), None
        add_benchmark_arguments(self, bench, ["shoal", *sys.argv[1:]])

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._fill()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self._fill()
        return super().format_usage()

    def format_help(self) -> str:
        self._fill()
        return super().format_help()


def main(bench: Any, argv: list[str] | None = None) -> int:
    """``bench.command ARGV``: the whole command line of one benchmark, for a benchmark run as its own
    program (``python -m benchmarks.NAME``); a ShoalError is its one line and HINT, as ``shoal``'s."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = ArgumentParser(prog=bench.command, formatter_class=HelpFormatter)
    add_benchmark_arguments(parser, bench, [*shlex.split(bench.command), *argv])
    try:
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except ShoalError as err:
        print(err.format(), file=sys.stderr, flush=True)
        return err.exit_code
    except KeyboardInterrupt:
        print(f"{bench.command}: interrupted", file=sys.stderr)
        return 130


def add_benchmark_arguments(parser: argparse.ArgumentParser, bench: Any, command: list[str]) -> None:
    """Fill ``parser`` from ``bench``: its description and examples, ``--smoke``, ``--json``, ``--plot``
    and one flag per config field; parsing then runs it, its report naming ``command`` (the argv given)."""
    parser.description, parser.epilog = bench.description, bench.examples
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: runs in seconds, the numbers mean nothing")
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON (and a PNG plot beside it)")
    parser.add_argument("--plot", metavar="PATH", help="write the plot here (PNG; needs matplotlib)")
    names = add_config_flags(parser, bench.config)
    parser.set_defaults(func=lambda args: _run(bench, names, args, command))


def add_config_flags(parser: argparse.ArgumentParser, cls: type) -> list[str]:
    """One flag per field of ``cls``, in field order; return the field names.

    A field whose metadata holds a :class:`shoal.bench.harness.Flag` (``--dir`` for ``directory``,
    sizes with K/M/G units) gets the flag it describes, one whose ``flag`` is False none; every other field the one
    :func:`shoal.cli.fields.add_fields` derives from its type. Either way the docstring is the help.
    """
    names = []
    for field in dataclasses.fields(cls):
        spec = field.metadata.get("flag")
        if spec is False:  # set by the benchmark itself (``--smoke``'s sizes), not by the user
            continue
        doc = " ".join(field_docs(cls).get(field.name, "").split("\n\n", 1)[0].split())
        if spec is None:
            names += add_fields(parser, cls, only=[field.name])
            continue
        default = spec.default if spec.default is not None else field.default
        help_text = help_style(doc) + (
            f" (default: {default})" if default not in (None, (), dataclasses.MISSING) else ""
        )
        parser.add_argument(
            spec.name or flag_name(field.name),
            dest=field.name,
            type=spec.parse,
            metavar=spec.metavar or field.name.upper(),
            default=argparse.SUPPRESS,
            help=help_text.replace("%", "%%"),
        )
        names.append(field.name)
    return names


def _run(bench: Any, names: list[str], args: argparse.Namespace, command: list[str]) -> int:
    from shoal.bench.harness import run_and_write

    cfg = bench.configure(smoke=args.smoke, **given_fields(args, names))
    run_and_write(bench, cfg, smoke=args.smoke, json_path=args.json, plot_path=args.plot, argv=command)
    return 0


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2
