"""argparse with shoal's errors: one line naming the problem and a HINT, not a usage dump."""

from __future__ import annotations

import argparse
import re
from typing import NoReturn

from shoal.errors import ShoalError

_ARGUMENT = re.compile(r"^argument (\S+?)(?:/\S+)?: ")
_CHOICES = re.compile(r"is not one of: (.+)$")


class ArgumentParser(argparse.ArgumentParser):
    """The parser of ``shoal`` and every subcommand (subparsers inherit the class)."""

    def error(self, message: str) -> NoReturn:
        # "argument --amp: 'fp8' is not one of: ..." -> "--amp 'fp8' is not one of: ..."
        message = _ARGUMENT.sub(lambda m: f"{m.group(1)} ", message)
        choices = _CHOICES.search(message)
        hint = f"choose one of: {choices.group(1)}" if choices else f"see `{self.prog} --help`"
        raise ShoalError(message, hint)


def errors_with_hints(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Give a parser built elsewhere (torchrun's) the same one-line errors."""
    parser.error = ArgumentParser.error.__get__(parser)  # type: ignore[method-assign]
    return parser
