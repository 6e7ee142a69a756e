"""shoal's lines on the terminal: one write per line, so lines from several processes never run together;
and the one style of a flag's help (:func:`help_text`), the same in every command's ``--help``."""

from __future__ import annotations

import os
import sys
from typing import TextIO

LAUNCHER_ENV = "SHOAL_LAUNCHER"
"""Set by shoal's launcher in its workers' environment to the command the user ran (``shoal run``,
``shoal train``), for the lines that say how a worker was started: the workers also see torchrun's
variables, and "via torchrun" would name a command the user never typed."""


def write_line(text: str, stream: TextIO | None = None) -> None:
    """Write ``text`` and a newline with one ``write`` call on the stream's file descriptor.

    ``print`` writes the text and the newline separately, so lines that several processes print at
    the same instant run together on one line of the terminal; one small write does not interleave.
    """
    stream = stream or sys.stderr
    data = (text + "\n").encode(errors="replace")
    try:
        stream.flush()
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # a captured or closed stream
        stream.write(text + "\n")
        return
    while data:
        data = data[os.write(fd, data) :]


_NAMES = frozenset({"Open", "Kubernetes", "Kubeflow", "Slurm", "Python", "TensorFlow", "Horovod", "Docker", "Linux"})
"""Capitalised words a help may start with that stay capitalised: names."""


def help_text(text: str) -> str:
    """A flag's help in the one style of shoal's ``--help`` (argparse's own: "show this help message
    and exit"): whitespace collapsed, a lower-case first letter unless the first word is an acronym or
    a name (``CUDA``, ``PyTorch``, ``Kubernetes``, ``Run:ai``), no closing full stop."""
    text = " ".join(text.split())
    first = text.split(" ", 1)[0]
    if first == "A" or (first[:1].isupper() and first[1:].isalpha() and first[1:].islower() and first not in _NAMES):
        text = text[0].lower() + text[1:]
    if text.endswith(".") and not text.endswith(".."):
        text = text[:-1]
    return text
