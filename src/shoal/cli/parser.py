"""argparse with shoal's errors: one line naming the problem and a HINT, not a usage dump."""

from __future__ import annotations

import argparse
import re
from typing import NoReturn

from shoal.errors import ShoalError, close_match

_ARGUMENT = re.compile(r"^argument (\S+?)(?:/\S+)?: ")
_CHOICES = re.compile(r"is not one of: (.+)$")
_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.+)\)$")


class ArgumentParser(argparse.ArgumentParser):
    """The parser of ``shoal`` and every subcommand (subparsers inherit the class)."""

    def error(self, message: str) -> NoReturn:
        # "argument --amp: 'fp8' is not one of: ..." -> "--amp 'fp8' is not one of: ..."
        message = _ARGUMENT.sub(lambda m: f"{m.group(1)} ", message)
        choices = _CHOICES.search(message)
        invalid = _INVALID_CHOICE.search(message)
        if invalid:  # a subcommand: "COMMAND invalid choice: 'trian' (choose from 'train', ...)"
            given, names = invalid.group(1), re.findall(r"'([^']*)'", invalid.group(2))
            message = f"unknown command '{given}' (commands: {', '.join(names)})"
            close = close_match(given, names)
            hint = f"did you mean `{self.prog} {close}`?" if close else f"see `{self.prog} --help`"
        elif choices:
            hint = f"choose one of: {choices.group(1)}"
        else:
            hint = f"see `{self.prog} --help`"
        raise ShoalError(message, hint)


def errors_with_hints(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Give a parser built elsewhere (torchrun's) the same one-line errors."""
    parser.error = ArgumentParser.error.__get__(parser)  # type: ignore[method-assign]
    return parser
