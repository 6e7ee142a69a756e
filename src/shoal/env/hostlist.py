"""Slurm's compressed notations: host lists (``gpu[01-03,7],cpu5``) and per-node counts (``2(x3),1``).

Host lists, as in ``SLURM_JOB_NODELIST`` and ``scontrol show hostnames``:

- items are separated by commas outside brackets;
- a bracket holds comma-separated numbers or ``lo-hi`` ranges; the width of ``lo`` is kept, so
  ``[08-10]`` gives ``08 09 10`` and ``[1-10]`` gives ``1 .. 10``;
- several bracket groups in one item multiply, leftmost outermost:
  ``a[1-2]-b[3-4]`` is ``a1-b3 a1-b4 a2-b3 a2-b4``.

Counts, as in ``SLURM_TASKS_PER_NODE``: comma-separated numbers, ``N(xK)`` meaning K nodes with N.

Both raise ``ValueError`` saying what is malformed; callers turn it into a ShoalError naming the
variable it came from.
"""

from __future__ import annotations

import itertools
import re

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_COUNT = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def expand_hostlist(text: str) -> list[str]:
    """Every host name in a Slurm host list, in order (duplicates kept, as Slurm does)."""
    hosts: list[str] = []
    for item in _split_top_level(text.strip(), text):
        hosts.extend(_expand_item(item, text))
    return hosts


def expand_counts(text: str) -> list[int]:
    """``"2(x3),1"`` -> ``[2, 2, 2, 1]``: one count per node."""
    counts: list[int] = []
    for part in text.strip().split(","):
        match = _COUNT.fullmatch(part.strip())
        if not match:
            raise ValueError(f"{part!r} in {text!r} is not N or N(xK)")
        repeat = int(match.group(2) or 1)
        if repeat < 1:
            raise ValueError(f"{part!r} in {text!r} repeats zero times")
        counts.extend([int(match.group(1))] * repeat)
    return counts


def _split_top_level(text: str, whole: str) -> list[str]:
    """Split on commas that are not inside brackets; check the brackets balance and do not nest."""
    items, start, depth = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            if depth:
                raise ValueError(f"nested '[' in host list {whole!r}")
            depth = 1
        elif char == "]":
            if not depth:
                raise ValueError(f"unmatched ']' in host list {whole!r}")
            depth = 0
        elif char == "," and not depth:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unclosed '[' in host list {whole!r}")
    items.append(text[start:])
    if any(not item.strip() for item in items):
        raise ValueError(f"empty host name in host list {whole!r}")
    return [item.strip() for item in items]


def _expand_item(item: str, whole: str) -> list[str]:
    # "a[1-2]-b[3-4]" -> literal/bracket pieces ["a", ["1","2"], "-b", ["3","4"]], then a product.
    pieces: list[list[str]] = []
    end = 0
    for match in re.finditer(r"\[([^\]]*)\]", item):
        pieces.append([item[end : match.start()]])
        pieces.append(_expand_bracket(match.group(1), whole))
        end = match.end()
    pieces.append([item[end:]])
    return ["".join(parts) for parts in itertools.product(*pieces)]


def _expand_bracket(body: str, whole: str) -> list[str]:
    numbers: list[str] = []
    if not body.strip():
        raise ValueError(f"empty brackets in host list {whole!r}")
    for part in body.split(","):
        match = _RANGE.fullmatch(part.strip())
        if not match:
            raise ValueError(f"[{body}] in host list {whole!r}: {part!r} is not a number or lo-hi range")
        lo_text, hi_text = match.group(1), match.group(2)
        if hi_text is None:
            numbers.append(lo_text)
            continue
        lo, hi = int(lo_text), int(hi_text)
        if lo > hi:
            raise ValueError(f"[{body}] in host list {whole!r}: range {part!r} runs backwards")
        width = len(lo_text)
        numbers.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return numbers
