"""The one error type users see.

Every failure shoal can explain is raised as :class:`ShoalError` with a one-line message naming the
problem and a hint saying what to do. The CLI prints it as two lines (``shoal: error: ...`` and
``HINT: ...``) and exits non-zero, without a traceback.
"""

from __future__ import annotations

from collections.abc import Iterable

EXIT_ANOTHER_NODE_FAILED = 75
"""Exit status of a node whose workers were stopped because another node's failed. Distinct from
the failing node's own status (a Python error exits 1) so that whoever gathers the nodes' statuses
(``shoal launch``, ``sacct``, a Kubernetes pod list) can tell the cause from its consequences;
75 lies in sysexits' range, clear of Python's 1, the shells' 126/127 and 128+N for signal N."""
EXIT_HUNG = 124
"""Exit status of a launcher that stopped a hung job (``--on-hang stop``): GNU ``timeout``'s when the
command timed out, so scripts that already handle ``timeout`` read it the same way."""


class ShoalError(Exception):
    """A problem with the user's input or environment that shoal can explain.

    Args:
        message: one line naming the problem (what, and which value/file/endpoint).
        hint: one line saying how to fix it.
        exit_code: the process exit status the CLI uses.
        detail: lines printed before the error's, when the user needs to see them to act (the
            source line of a syntax error and its caret).
    """

    def __init__(self, message: str, hint: str = "", *, exit_code: int = 2, detail: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code
        self.detail = detail

    def format(self) -> str:
        text = f"{self.detail}\n" if self.detail else ""
        text += f"shoal: error: {self.message}"
        if self.hint:
            text += f"\nHINT: {self.hint}"
        return text


def first_line(err: BaseException, limit: int = 300) -> str:
    """The first informative line of ``err`` or of its cause (torch chains the real one), at most
    ``limit`` characters; the exception's type name when it says nothing."""
    seen: BaseException | None = err
    for _ in range(4):
        if seen is None:
            break
        text = str(seen).strip()
        if text and "See inner exception" not in text:
            return text.splitlines()[0][:limit]
        seen = seen.__cause__
    return type(err).__name__


def check_choice(what: str, value: str, choices: tuple[str, ...], hint: str | None = None) -> str:
    """``value`` if it is one of ``choices``, else a ShoalError naming it (``unknown WHAT 'value'``)
    with ``hint``, by default the list (``use one of: a, b``)."""
    if value not in choices:
        raise ShoalError(f"unknown {what} {value!r}", hint or f"use one of: {', '.join(choices)}")
    return value


def close_match(word: str, choices: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The one of ``choices`` that ``word`` is a near miss of (difflib's ratio of ``cutoff`` or
    more), if any: for a HINT's "did you mean ...?"."""
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    return close[0] if close else None
