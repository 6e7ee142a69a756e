"""Every relative link in README.md, CONTRIBUTING.md and docs/ (docs/contributing/ too) resolves: the file exists and, for
``file.md#anchor``, the file has a heading with that anchor (GitHub's rule: lower case, punctuation
dropped, spaces as hyphens). Plain mentions of ``docs/NAME.md`` and ``examples/NAME.py`` count too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import ROOT

PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").rglob("*.md")])
LINK = re.compile(r"\]\(([^)\s]+)\)")
MENTION = re.compile(r"(?<![\w/.])((?:docs/(?:[\w-]+/)?[\w-]+\.md|examples/[\w-]+\.py))")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for the headings of ``page`` (duplicates get -1, -2...)."""
    found: set[str] = set()
    for heading in re.findall(r"^#+ (.+)$", FENCE.sub("", page.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        unique, n = slug, 0
        while unique in found:
            n += 1
            unique = f"{slug}-{n}"
        found.add(unique)
    return found


def targets(page: Path) -> list[str]:
    text = page.read_text()
    links = [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]  # http:, https:, mailto:
    return links + [str(ROOT / m) for m in MENTION.findall(text)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in targets(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)
