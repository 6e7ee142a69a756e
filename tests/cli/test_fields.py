"""Flags generated from config dataclasses: names, types, choices, help from docstrings, defaults."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Literal

import pytest

from shoal.cli.fields import add_fields, field_docs, given_fields


@dataclass(frozen=True, kw_only=True)
class Example:
    batch_size: int | None = None
    """Samples per process per step.

    A second paragraph that the help leaves out."""
    lr: float = 0.1
    """Base learning rate."""
    mode: Literal["none", "linear", "sqrt"] = "none"
    """How the lr scales with 100% of the world size."""
    progress: bool | None = None
    """Show a progress bar."""
    download: bool = False
    """Fetch the data first."""
    sizes: tuple[int, ...] = (1, 2)
    """Process counts."""
    undocumented: str = "x"

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError("lr must be positive")


def parser_for(**kw) -> tuple[argparse.ArgumentParser, list[str]]:
    parser = argparse.ArgumentParser(prog="t", exit_on_error=False)
    return parser, add_fields(parser, Example, **kw)


def test_docstrings_under_fields_become_help():
    docs = field_docs(Example)
    assert docs["batch_size"].startswith("Samples per process per step.")
    assert "undocumented" not in docs
    text = parser_for()[0].format_help()
    assert "--batch-size N" in text and "samples per process per step" in text  # shoal's help style
    assert "second paragraph" not in text
    assert "(default: 0.1)" in text and "100% of the world size" in text
    assert "--mode none|linear|sqrt" in text
    assert "--progress, --no-progress" in text


def test_only_given_flags_are_returned_and_the_dataclass_fills_the_rest():
    parser, names = parser_for()
    args = parser.parse_args(["--lr", "0.5", "--mode", "sqrt", "--no-progress", "--sizes", "1,2,4", "--download"])
    given = given_fields(args, names)
    assert given == {"lr": 0.5, "mode": "sqrt", "progress": False, "sizes": (1, 2, 4), "download": True}
    cfg = Example(**given)
    assert cfg.batch_size is None and cfg.undocumented == "x"
    assert given_fields(parser.parse_args([]), names) == {}


def test_bad_values_are_refused_by_the_parser():
    parser, _ = parser_for()
    for argv in (["--lr", "fast"], ["--mode", "cubic"], ["--sizes", "1,x"], ["--batch-size", "2.5"]):
        with pytest.raises(argparse.ArgumentError):
            parser.parse_args(argv)


def test_only_exclude_aliases_and_overrides():
    parser = argparse.ArgumentParser(prog="t")
    names = add_fields(
        parser,
        Example,
        only=["lr", "mode", "batch_size"],
        exclude=["mode"],
        aliases={"lr": ["-l"]},
        help_overrides={"batch_size": "per process"},
    )
    assert names == ["batch_size", "lr"]
    assert given_fields(parser.parse_args(["-l", "2"]), names) == {"lr": 2.0}
    assert "per process" in parser.format_help()
