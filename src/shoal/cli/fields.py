"""Command-line flags generated from a config dataclass: one field, one flag, its docstring the help.

A config class documents each field with a docstring right under it (torchtitan's habit)::

    @dataclass(frozen=True, kw_only=True)
    class TrainConfig:
        lr_scaling: Literal["none", "linear", "sqrt"] = "none"
        \"\"\"How the base lr grows with the world size: none, linear (x N) or sqrt (x sqrt N).\"\"\"

:func:`add_fields` turns that into ``--lr-scaling {none,linear,sqrt}`` with the docstring as help and
the default shown; :func:`given_fields` returns only the fields the user gave, so the dataclass's own
defaults (and its ``__post_init__`` checks) stay the single source of truth. Adding an option is
adding a field.

A field's ``metadata={"metavar": "DIR"}`` names its value in the help (default: N, X or TEXT),
``{"min": 1}`` and ``{"check": f}`` (``f(value)`` raises ValueError with what is wrong) check the
value as it is parsed, and ``metadata={"aliases": ("--nodes",)}`` adds the other spellings users bring from elsewhere (Slurm's,
torchrun's): one meaning, one flag, every command the same spellings. The help is written in the one
style of shoal's ``--help`` (:func:`shoal.console.help_text`).
Types understood: ``bool`` (``--x/--no-x``), ``int``, ``float``, ``str``, ``Literal[...]`` (choices),
``X | None`` of those (``None``: "not given, decide later"), and ``tuple[int, ...]`` /
``tuple[str, ...]`` (comma-separated). Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import textwrap
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any, Literal, Union

from shoal.console import help_text as help_style

_MISSING = dataclasses.MISSING
_METAVARS = {int: "N", float: "X", str: "TEXT"}


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass ``cls`` (and its dataclass bases), by field name."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass is object:
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):  # no source (frozen app, REPL): flags without help
            continue
        body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
        for node, after in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def flag_name(field_name: str) -> str:
    """``batch_size`` -> ``--batch-size``."""
    return "--" + field_name.replace("_", "-")


def add_fields(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    only: Iterable[str] | None = None,
    exclude: Iterable[str] = (),
    aliases: dict[str, list[str]] | None = None,
    help_overrides: dict[str, str] | None = None,
) -> list[str]:
    """Add one flag per field of ``cls`` (those in ``only``, minus ``exclude``); return the field names.

    Every flag defaults to "not given" (:data:`argparse.SUPPRESS`): :func:`given_fields` then
    returns what the user typed and the dataclass supplies the rest. ``aliases`` adds other
    spellings (``{"time_limit": ["-t"]}``); ``help_overrides`` replaces a field's docstring.
    """
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    wanted = set(only) if only is not None else None
    added = []
    for field in dataclasses.fields(cls):
        if (
            not field.init
            or field.metadata.get("flag") is False
            or field.name in exclude
            or (wanted is not None and field.name not in wanted)
        ):
            continue
        kind, choices, convert = _flag_type(hints[field.name], field.name, cls)
        if convert is not None and ("min" in field.metadata or "check" in field.metadata):
            convert = _checked(convert, field.metadata.get("min"), field.metadata.get("check"))
        default = _default_of(field)
        help_text = help_style((help_overrides or {}).get(field.name) or _first_paragraph(docs.get(field.name, "")))
        if default is not _MISSING and default is not None and default != () and kind != "bool":
            help_text += f" (default: {_show(default)})"
        names = [flag_name(field.name), *field.metadata.get("aliases", ()), *(aliases or {}).get(field.name, [])]
        help_text = help_text.replace("%", "%%")  # argparse formats help with %
        options: dict[str, Any] = {"dest": field.name, "default": argparse.SUPPRESS, "help": help_text}
        if kind == "bool":
            options["action"] = argparse.BooleanOptionalAction
        else:
            options["type"] = convert
            metavar = field.metadata.get("metavar") or _METAVARS.get(_strip_none(hints[field.name]), "VALUE")
            options["metavar"] = "|".join(choices) if choices else metavar
        parser.add_argument(*names, **options)
        added.append(field.name)
    return added


def given_fields(args: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    """The values of ``names`` that the command line set (absent ones were not given)."""
    return {name: getattr(args, name) for name in names if hasattr(args, name)}


# ---- types ------------------------------------------------------------------------------------------


def _flag_type(hint: Any, name: str, cls: type) -> tuple[str, tuple[str, ...], Callable[[str], Any] | None]:
    """(kind, choices, converter) for a field's type hint."""
    hint = _strip_none(hint)
    origin = typing.get_origin(hint)
    if hint is bool:
        return "bool", (), None
    if origin is Literal:
        choices = tuple(str(c) for c in typing.get_args(hint))
        return "choice", choices, _choice(choices, name)
    if hint in (int, float, str):
        return "scalar", (), _scalar(hint, name)
    if origin is tuple:
        item = typing.get_args(hint)[0]
        return "list", (), _comma_list(item, name)
    raise TypeError(f"{cls.__name__}.{name}: no command-line form for type {hint!r}")


def _strip_none(hint: Any) -> Any:
    if typing.get_origin(hint) in (Union, types.UnionType):
        rest = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return hint


def _scalar(kind: type, name: str) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return kind(text)
        except ValueError:
            what = {int: "a whole number", float: "a number"}.get(kind, kind.__name__)
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None

    convert.__name__ = kind.__name__  # argparse names it in "invalid int value"
    return convert


def _checked(convert: Callable[[str], Any], minimum: Any, check: Callable[[Any], None] | None) -> Callable[[str], Any]:
    """``convert``, then the field's own checks, said at parse time so that the error names the
    flag as typed (``--nproc-per-node 0``, not the field's ``--nproc``)."""

    def checked(text: str) -> Any:
        value = convert(text)
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {text}")
        if check is not None:
            try:
                check(value)
            except ValueError as err:
                raise argparse.ArgumentTypeError(f"{text!r} {err}") from None
        return value

    checked.__name__ = getattr(convert, "__name__", "value")
    return checked


def _choice(choices: tuple[str, ...], name: str) -> Callable[[str], str]:
    def convert(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of: {', '.join(choices)}")
        return text

    return convert


def _comma_list(item: Any, name: str) -> Callable[[str], tuple]:
    one = _scalar(item, name) if item in (int, float, str) else str

    def convert(text: str) -> tuple:
        values = tuple(one(v.strip()) for v in text.split(",") if v.strip())
        if not values:
            raise argparse.ArgumentTypeError("expected at least one value, comma-separated (e.g. 1,2)")
        return values

    return convert


def _default_of(field: dataclasses.Field) -> Any:
    if field.default is not _MISSING:
        return field.default
    if field.default_factory is not _MISSING:  # type: ignore[misc]
        return field.default_factory()  # type: ignore[misc]
    return _MISSING


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _first_paragraph(doc: str) -> str:
    return " ".join(doc.split("\n\n", 1)[0].split())
