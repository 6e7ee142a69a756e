"""argparse with shoal's errors: one line naming the problem and a HINT, not a usage dump.

Every argument error of every subcommand goes through :meth:`ArgumentParser.error`, which says it in
shoal's words: the flag as the user typed it (``--nproc-per-node two`` is not reported as
``--nproc``), "did you mean" for a near miss of a flag or a command, and the ``--help`` of the
command that was given (``shoal train --help``, not ``shoal --help``). One help style for all:
:class:`HelpFormatter` wraps at :data:`HELP_WIDTH` columns at most, and :func:`shoal.console.help_text`
writes a flag's help as argparse writes its own (a lower-case start, no closing full stop).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import textwrap
from collections.abc import Sequence
from typing import Any, NoReturn

from shoal.errors import ShoalError, close_match

HELP_WIDTH = 100
"""Columns of every ``--help`` (fewer on a narrower terminal)."""

_ARGUMENT = re.compile(r"^argument (\S+): ")
_CHOICES = re.compile(r"is not one of: (.+)$")
_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.+)\)$")
_INVALID_TYPE = re.compile(r"^invalid (int|float) value: ('.*')$")
_UNRECOGNIZED = "unrecognized arguments: "
_REQUIRED = re.compile(r"^the following arguments are required: (.+)$")
_DEEPEST = "_shoal_parser"
"""Namespace attribute: the innermost parser that left arguments unrecognized (the subcommand's)."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every shoal ``--help``: flags' help wrapped at :data:`HELP_WIDTH` columns (the terminal's width
    when narrower); descriptions and examples as written, a line over :data:`HELP_WIDTH` wrapped."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None):
        if width is None:
            width = min(HELP_WIDTH, shutil.get_terminal_size().columns - 2)
        super().__init__(prog, indent_increment, max_help_position, width)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        # Descriptions and examples as written (an example line stays whole on a narrow terminal),
        # but none wider than HELP_WIDTH: a longer one wraps, its continuation indented under its start.
        width = HELP_WIDTH - len(indent)
        lines = []
        for line in text.splitlines():
            lead = indent + line[: len(line) - len(line.lstrip())]
            lines += textwrap.wrap(
                line.strip(), width, initial_indent=lead, subsequent_indent=lead + "    ", break_on_hyphens=False
            ) or [indent]
        return "\n".join(lines)

    def _split_lines(self, text: str, width: int) -> list[str]:
        # Never at a hyphen: a flag named in a help (--node-rank) stays whole, as the user types it.
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class ArgumentParser(argparse.ArgumentParser):
    """The parser of ``shoal`` and every subcommand (subparsers inherit the class)."""

    required_messages: dict[str, tuple[str, str]] = {}
    """A missing positional (its metavar) -> (message, hint), in the command's own words."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # One help style for every subcommand: argparse's formatters (which a module may still name)
        # give way to shoal's, whose width is the same everywhere.
        if not issubclass(kwargs.get("formatter_class", argparse.HelpFormatter), HelpFormatter):
            kwargs["formatter_class"] = HelpFormatter
        super().__init__(*args, **kwargs)
        self._typed: list[str] = []

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        self._typed = list(sys.argv[1:] if args is None else args)
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and not hasattr(namespace, _DEEPEST):  # a subcommand's parser returns first
            setattr(namespace, _DEEPEST, self)
        return namespace, extras

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:
        namespace, extras = self.parse_known_args(args, namespace)
        deepest = vars(namespace).pop(_DEEPEST, self)
        if extras:
            deepest.error(_UNRECOGNIZED + " ".join(extras))
        return namespace

    def error(self, message: str) -> NoReturn:
        raise ShoalError(*self.explain(message))

    def explain(self, message: str) -> tuple[str, str]:
        """argparse's ``message`` as shoal's (message, hint)."""
        see = f"see `{self.prog} --help`"
        if message.startswith(_UNRECOGNIZED):
            return self._unrecognized(message[len(_UNRECOGNIZED) :].split(" "), see)
        required = _REQUIRED.match(message)
        if required:
            names = required.group(1).split(", ")
            if names[0] in self.required_messages:
                return self.required_messages[names[0]]
            return f"missing {' and '.join(names)}", see
        invalid = _INVALID_CHOICE.search(message)
        argument = _ARGUMENT.match(message)
        if invalid and (argument is None or not argument.group(1).startswith("-")):
            # a subcommand: "argument COMMAND: invalid choice: 'trian' (choose from 'train', ...)"
            given, names = invalid.group(1), re.findall(r"'([^']*)'", invalid.group(2))
            close = close_match(given, names)
            hint = f"did you mean `{self.prog} {close}`?" if close else see
            return f"unknown command '{given}' (commands: {', '.join(names)})", hint
        if argument is None:
            return message, see
        flag = self._as_typed(argument.group(1).split("/"))
        detail = message[argument.end() :]
        if invalid:
            given, names = invalid.group(1), re.findall(r"'([^']*)'", invalid.group(2))
            close = close_match(given, names)
            hint = f"did you mean {flag} {close}?" if close else f"choose one of: {', '.join(names)}"
            return f"{flag} {given!r} is not one of: {', '.join(names)}", hint
        typed = _INVALID_TYPE.match(detail)
        if typed:
            what = "a whole number" if typed.group(1) == "int" else "a number"
            return f"{flag} {typed.group(2)} is not {what}", see
        if detail == "expected one argument":
            return f"{flag} needs a value", see
        minimum = re.match(r"must be at least (\S+), got ", detail)
        if minimum:
            return f"{flag} {detail}", f"give {flag} {minimum.group(1)} or more ({see})"
        choices = _CHOICES.search(detail)
        return f"{flag} {detail}", (f"choose one of: {choices.group(1)}" if choices else see)

    def _unrecognized(self, extras: list[str], see: str) -> tuple[str, str]:
        flags = [word for word in extras if word.startswith("-") and word != "-"]
        if not flags:
            return f"unexpected argument {extras[0]!r}", see
        typed = flags[0].split("=", 1)[0]
        # Compared without the dashes, which every long flag shares: "--nprocs" is not near "--controls".
        names = {name[2:]: name for name in self._option_string_actions if name.startswith("--")}
        # Closer than a command's near miss: --hang-timeout is not a typo of --join-timeout.
        close = close_match(typed.lstrip("-"), names, cutoff=0.8) if typed.startswith("--") else None
        hint = f"did you mean {names[close]}? ({see})" if close else see
        return f"unknown flag {typed}", hint

    def _as_typed(self, names: list[str]) -> str:
        """Which of a flag's spellings (``--nproc``, ``--nproc-per-node``) the user typed; an
        abbreviation as typed; the first spelling when none is found."""
        for word in self._typed:
            name = word.split("=", 1)[0]
            if name in names:
                return name
        for word in self._typed:
            name = word.split("=", 1)[0]
            if name.startswith("--") and len(name) > 2 and any(n.startswith(name) for n in names):
                return name
        return names[0]
