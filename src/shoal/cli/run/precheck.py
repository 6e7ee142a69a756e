"""What ``shoal run`` checks of its script before torch is imported (2-3 s of CPU) and before any
worker starts: a script that does not exist, a program not on PATH, a script that does not compile.
Each is one error said once, in a fraction of a second, instead of once per worker. (The flags are
checked by ``shoal run``'s own parser, torch-free too: :func:`shoal.cli.run.args.build_parser`.)
"""

from __future__ import annotations

import argparse
import os
import shutil
import traceback

from shoal.errors import ShoalError


def check_run_args(args: argparse.Namespace) -> None:
    """The script (or ``--no-python`` program) of ``shoal run``'s parsed arguments must exist here and
    compile; ``-m module`` is not checked."""
    check_script(args.training_script, module=args.module, no_python=args.no_python, run_path=args.run_path)


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
