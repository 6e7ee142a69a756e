"""``shoal bench NAME`` and ``python -m benchmarks.NAME`` flags: generated from each config dataclass's
fields and docstrings; ``shoal bench`` lists the user's tools only."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from dataclasses import dataclass, field, fields

import pytest
from benchmark_command import ROOT

from shoal.bench import BENCHMARKS, benchmark
from shoal.bench.harness import flag
from shoal.bench.report import parse_size
from shoal.cli.bench import add_benchmark_arguments, add_config_flags, register
from shoal.cli.fields import field_docs, given_fields
from shoal.console import help_text
from shoal.errors import ShoalError

PROJECT_BENCHMARKS = ("overhead", "data", "startup", "checkpoint", "memory")
"""The project's own benchmarks beside the package: ``python -m benchmarks.NAME``, not ``shoal bench``."""


def bench_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shoal")
    register(parser.add_subparsers(dest="command"))
    return parser


def any_benchmark(name: str):
    """``shoal bench NAME``'s benchmark, or the project's own ``benchmarks.NAME``."""
    return benchmark(name) if name in BENCHMARKS else importlib.import_module(f"benchmarks.{name}").BENCHMARK


def module_parser(name: str) -> argparse.ArgumentParser:
    """The parser of ``python -m benchmarks.NAME`` (what :func:`shoal.cli.bench.main` builds)."""
    bench = any_benchmark(name)
    parser = argparse.ArgumentParser(prog=bench.command, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_benchmark_arguments(parser, bench, bench.command.split())
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed by the real parser: ``shoal bench ARGV``, or ``python -m benchmarks.ARGV[0] ARGV[1:]``."""
    if argv[0] in BENCHMARKS:
        return bench_parser().parse_args(["bench", *argv])
    return module_parser(argv[0]).parse_args(argv[1:])


def config_from(argv: list[str]):
    """The config the command would run (parsed by the real parser, nothing measured)."""
    args = parse(argv)
    bench = any_benchmark(argv[0])
    return bench.configure(smoke=args.smoke, **given_fields(args, [f.name for f in fields(bench.config)]))


def help_of(name: str) -> str:
    if name not in BENCHMARKS:
        return module_parser(name).format_help()
    sub = next(a for a in bench_parser()._actions if isinstance(a, argparse._SubParsersAction))
    benches = next(a for a in sub.choices["bench"]._actions if isinstance(a, argparse._SubParsersAction))
    return benches.choices[name].format_help()


@pytest.mark.parametrize("name", [*BENCHMARKS, *PROJECT_BENCHMARKS])
def test_every_field_is_a_flag_with_its_docstring_as_help(name, monkeypatch):
    monkeypatch.setenv("COLUMNS", "500")  # argparse wraps help at hyphens too ("--min-" / "iters")
    bench = any_benchmark(name)
    text = help_of(name)
    squashed = " ".join(text.split())
    docs = field_docs(bench.config)
    for f in fields(bench.config):
        if f.metadata.get("flag") is False:  # set by the benchmark itself (--smoke's advise=False)
            assert "--" + f.name.replace("_", "-") not in text, f.name
            continue
        spelled = f.metadata["flag"].name if "flag" in f.metadata and f.metadata["flag"].name else None
        assert (spelled or "--" + f.name.replace("_", "-")) in text, f.name
        first_sentence = help_text(" ".join(docs[f.name].split(".")[0].split()))  # in the one help style
        assert first_sentence in squashed, f.name
    for common in ("--smoke", "--json PATH", "--plot PATH"):
        assert common in text
    assert text.rstrip().endswith(bench.examples.rstrip())  # the help ends with worked examples


def test_existing_flags_keep_their_names_and_meaning():
    scaling = config_from(
        ["scaling", "--world-sizes", "1,2", "--no-controls", "--device", "cpu", "--comm-hook", "bf16"]
    )
    assert scaling.world_sizes == (1, 2) and scaling.controls is False and scaling.comm_hook == ("bf16",)
    assert config_from(["scaling"]).controls is True
    allreduce = config_from(
        ["allreduce", "--min-bytes", "4K", "--max-bytes", "1M", "--nproc", "2", "--target-time", "0.5"]
    )
    assert (allreduce.min_bytes, allreduce.max_bytes, allreduce.nproc, allreduce.target_time) == (4096, 2**20, 2, 0.5)
    overhead = config_from(["overhead", "--variants", "plain,shoal", "--start-method", "spawn"])
    assert overhead.variants == ("plain", "shoal") and overhead.start_method == "spawn"
    assert config_from(["checkpoint", "--dir", "."]).directory == "."
    assert config_from(["data", "--data", "/nowhere", "--num-workers", "2"]).num_workers == 2
    assert config_from(["startup", "--variants", "torchrun,shoal_run", "--nproc", "3"]).variants == (
        "torchrun",
        "shoal_run",
    )


def test_smoke_starts_from_tiny_sizes_and_a_given_flag_wins():
    cfg = config_from(["checkpoint", "--smoke", "--repeat", "3"])
    assert (cfg.model, cfg.repeat, cfg.warmup) == ("mb:2", 3, 0)
    cfg = config_from(["scaling", "--smoke", "--world-sizes", "1"])
    assert cfg.world_sizes == (1,) and cfg.steps == 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (["scaling", "--world-sizes", "1,two"], "comma-separated integers"),
        (["allreduce", "--min-bytes", "4X"], "expected a size such as 4096, 4K"),
        (["scaling", "--device", "tpu"], "'tpu' is not one of: auto, cpu, cuda"),
        (["overhead", "--start-method", "forkserver"], "'forkserver' is not one of: auto, fork, spawn"),
        (["startup", "--nproc", "two"], "'two' is not a whole number"),
    ],
)
def test_malformed_values_are_refused_by_the_parser(argv, message, capsys):
    # `shoal bench NAME`: shoal's parser, one line and a HINT; `python -m benchmarks.NAME` here: argparse's
    with pytest.raises((SystemExit, ShoalError)) as refused:
        parse(argv)
    if isinstance(refused.value, ShoalError):
        assert message in refused.value.message
    else:
        assert refused.value.code == 2 and message in capsys.readouterr().err


def test_shoal_bench_lists_the_users_tools_only(capsys):
    with pytest.raises(SystemExit):
        bench_parser().parse_args(["bench", "--help"])
    text = capsys.readouterr().out
    assert "scaling" in text and "allreduce" in text
    assert not any(name in text for name in PROJECT_BENCHMARKS)
    with pytest.raises(SystemExit) as exit_:
        bench_parser().parse_args(["bench", "startup"])
    assert exit_.value.code == 2 and "invalid choice: 'startup'" in capsys.readouterr().err


def test_a_project_benchmark_answers_help_without_importing_torch():
    """``python -m benchmarks.NAME --help``, as the project's developer runs it from the repository root."""
    argv = [sys.executable, "-X", "importtime", "-m", "benchmarks.startup", "--help"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m benchmarks.startup [-h] [--smoke]")
    assert proc.stdout.rstrip().endswith(
        "python -m benchmarks.startup --smoke  # torchrun and shoal run once, 1 worker"
    )
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert "benchmarks.peers" in imported and "shoal.cli.bench" in imported and "torch" not in imported


def test_a_new_option_is_one_field():
    @dataclass(frozen=True)
    class Toy:
        rounds: int = 3
        """Rounds to run.

        A second paragraph the help leaves out."""
        chunk: int = field(default=2**20, metadata=flag(parse=parse_size, metavar="SIZE", default="1M"))
        """Bytes per chunk."""
        where: str | None = field(default=None, metadata=flag(name="--in", metavar="DIR"))
        """Where to write."""

    parser = argparse.ArgumentParser(prog="toy")
    names = add_config_flags(parser, Toy)
    assert names == ["rounds", "chunk", "where"]
    text = " ".join(parser.format_help().split())
    assert "rounds to run (default: 3)" in text and "second paragraph" not in text and "--rounds" in text
    assert "--chunk SIZE bytes per chunk (default: 1M)" in text and "--in DIR where to write" in text
    args = parser.parse_args(["--chunk", "4K", "--in", "/x"])
    assert Toy(**given_fields(args, names)) == Toy(rounds=3, chunk=4096, where="/x")
    assert given_fields(parser.parse_args([]), names) == {}


def test_bench_help_imports_no_torch_and_no_benchmark_until_named():
    code = """
import argparse, sys
from shoal.cli.bench import register
parser = argparse.ArgumentParser(prog="shoal")
register(parser.add_subparsers())
before = sorted(m for m in sys.modules if m.startswith("shoal.bench."))
for name in ("scaling", "allreduce"):
    try:
        parser.parse_args(["bench", name, "--help"])
    except SystemExit:
        pass
print(before, "torch" in sys.modules)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[] False"
    assert "shoal bench allreduce --smoke" in proc.stdout
