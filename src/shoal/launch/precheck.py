"""What ``shoal run`` can tell about its command line before torch is imported (2-3 s of CPU) and
before any worker starts: a worker count below 1, a script that does not exist, a script that does
not compile. Each is one error said once, in a fraction of a second, instead of once per worker.

torchrun's flags live in torch's parser; which of them take a value is read from its help, frozen
in :mod:`shoal.launch.run_help` (kept equal to torch's by ``tests/cli/test_help.py``). A command
line this scan cannot read for sure (an abbreviated or unknown flag) is left to torch's parser,
and the same checks run again after it (:func:`check_script`).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import traceback
from dataclasses import dataclass, field

from shoal.errors import ShoalError

_OPTION_LINE = re.compile(r"^  (-[^ ].*?)(?:\s{2,}|$)")
_NPROC_FLAGS = ("--nproc", "--nproc-per-node", "--nproc_per_node")


@functools.cache
def _takes_value() -> dict[str, bool]:
    """Every flag of ``shoal run`` -> whether it takes a value (``--nnodes NNODES``: yes)."""
    from shoal.launch.run_help import TEXT

    flags: dict[str, bool] = {}
    for line in TEXT.splitlines():
        match = _OPTION_LINE.match(line)
        if not match:
            continue
        for spelling in re.split(r", (?=-)", match.group(1)):
            name, _, metavar = spelling.partition(" ")
            flags[name] = bool(metavar)
    return flags


@dataclass
class CommandLine:
    """``shoal run``'s arguments as far as the scan read them."""

    flags: dict[str, str | None] = field(default_factory=dict)
    """Each launcher flag given -> its value (None for a flag without one); the last one wins."""
    script: str | None = None
    """The script, module or program (the first argument that is not a launcher flag's)."""

    def given(self, *names: str) -> bool:
        return any(name in self.flags for name in names)


def scan(argv: list[str]) -> CommandLine | None:
    """The launcher's flags and the script in ``argv``; None when a flag is not one the frozen help
    knows (an abbreviation, a typo: torch's parser says what it makes of it)."""
    known = _takes_value()
    line = CommandLine()
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            line.script = argv[i + 1] if i + 1 < len(argv) else None
            return line
        if not token.startswith("-") or token == "-":
            line.script = token
            return line
        name, equals, value = token.partition("=")
        if name not in known:
            return None
        if known[name] and not equals:
            if i + 1 >= len(argv):
                return None
            value = argv[i + 1]
            i += 1
        line.flags[name] = value if known[name] else None
        i += 1
    return line


def precheck(argv: list[str]) -> None:
    """Raise :class:`ShoalError` for what ``argv`` gets wrong that needs neither torch nor a worker:
    ``--nproc 0``, a missing script, a script with a syntax error. Silent when unsure."""
    line = scan(argv)
    if line is None:
        return
    for name in _NPROC_FLAGS:
        value = (line.flags.get(name) or "").strip()
        if value.lstrip("-").isdigit() and int(value) < 1:
            raise ShoalError(f"{name} must be at least 1, got {value}", "give the number of worker processes, e.g. 2")
    if line.script is not None:
        check_script(
            line.script,
            module=line.given("-m", "--module"),
            no_python=line.given("--no-python", "--no_python"),
            run_path=line.given("--run-path", "--run_path"),
        )


def check_script(path: str, *, module: bool = False, no_python: bool = False, run_path: bool = False) -> None:
    """The script (or ``--no-python`` program) exists here, and a Python script compiles: a syntax
    error is found once, here, rather than by every worker. ``-m module`` is not checked."""
    if module:
        return
    if no_python and not run_path:
        if shutil.which(path) is None:
            raise ShoalError(
                f"program not found: {path} (--no-python runs it directly)",
                "give a path to an executable or a command on PATH",
            )
        return
    if not os.path.exists(path):
        raise ShoalError(
            f"script not found: {path} (working directory: {os.getcwd()})",
            "check the path; to run a module, use -m package.module; for a program that is not Python, add --no-python",
        )
    check_compiles(path)


def check_compiles(path: str) -> None:
    """Compile the Python script at ``path`` (nothing runs); a ``SyntaxError`` becomes a ShoalError
    whose detail is Python's own account (the file, the line, the caret). Files that are not Python
    source (binary, unreadable) are left to the interpreter."""
    try:
        with open(path, "rb") as f:
            source = f.read()
        compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as err:
        # Python's account without its first and last lines (the file and line, the message: both
        # are in the error's one line): the offending source line and its caret.
        detail = "".join(traceback.format_exception_only(type(err), err)[1:-1]).rstrip()
        where = f"{path}, line {err.lineno}" if err.lineno else path
        raise ShoalError(
            f"{where}: {type(err).__name__}: {err.msg} (no worker was started)",
            "fix that line, then run the same command again",
            detail=detail,
        ) from None
    except (OSError, ValueError):  # unreadable, a directory, NUL bytes: the interpreter says what it is
        return
