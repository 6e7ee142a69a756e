"""docs/ARCHITECTURE.md's layers are pyproject's import contracts: the stack drawn on the page, each
"layers inside" row of its contracts table, and the table's one row per contract. A contract that
changes without the page (or the page without the contract) fails here, so the map cannot drift."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs/ARCHITECTURE.md"
BESIDE = "beside the stack:"


def _level(text: str) -> str:
    """One level as pyproject writes it (``a | b``, ``a : b``), whitespace and markdown escapes aside."""
    return " ".join(text.replace("\\|", "|").split())


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _contracts() -> list[dict]:
    import tomllib  # Python 3.11 and later: the suite's, not the package's

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _layers_by_container() -> dict[str, list[str]]:
    return {c["containers"][0]: [_level(x) for x in c["layers"]] for c in _contracts() if c["type"] == "layers"}


def _page_stack(text: str) -> tuple[list[str], list[str]]:
    """The diagram's levels, highest first, and the packages it sets beside the stack: each line's
    first column, up to the first blank line; then the ``beside the stack:`` line."""
    block = _section(text, "The layers").split("```")[1]
    levels, beside = [], []
    for line in block.strip("\n").splitlines():
        first = re.split(r"\s{2,}", line.strip())[0]
        if first.startswith(BESIDE):
            beside += [name.strip() for name in first[len(BESIDE) :].split(",")]
        elif first:
            levels.append(_level(first))
    return levels, beside


def _page_contract_rows(text: str) -> list[tuple[str, str]]:
    """The contracts table's rows as (contract, what it checks)."""
    rows = []
    table = _section(text, "The layers").split("| contract | what it checks |")[1]
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
        rows.append((cells[0].strip(), cells[1].strip()))
    return rows


def _row_levels(cell: str) -> list[str]:
    """``a`` > ``b | c`` > ... at the start of a cell (a comment in parentheses may follow)."""
    chain = re.match(r"`[^`]+`(?: > `[^`]+`)*", cell)
    return [_level(x) for x in re.findall(r"`([^`]+)`", chain.group(0))] if chain else []


def test_the_page_draws_the_stack_of_the_layers_contract():
    levels, _ = _page_stack(PAGE.read_text())
    assert levels == _layers_by_container()["shoal"], (
        "docs/ARCHITECTURE.md's diagram (highest first) differs from pyproject's layers contract for shoal"
    )


def test_every_top_level_module_is_on_the_page():
    """Each of shoal's packages and modules is a level's name or stands beside the stack, and what stands
    beside it is in no level (launch: the forbidden contracts say what it may import)."""
    levels, beside = _page_stack(PAGE.read_text())
    in_levels = {name for level in levels for name in re.split(r" [|:] ", level)}
    src = ROOT / "src/shoal"
    modules = {p.stem for p in src.glob("*.py") if not p.name.startswith("__")}
    modules |= {p.name for p in src.iterdir() if (p / "__init__.py").is_file()}
    assert beside and not in_levels & set(beside), beside
    on_page = in_levels | set(beside)
    assert modules == on_page, (
        f"on the page, not in src/shoal: {sorted(on_page - modules)}; in src/shoal, not on the page: {sorted(modules - on_page)}"
    )


def test_each_packages_layers_row_is_its_contract():
    rows = _page_contract_rows(PAGE.read_text())
    contracts = _layers_by_container()
    on_page = {}
    for contract, checks in rows:
        inside = re.match(r"layers inside `([a-z_/]+)`", contract)
        if inside:
            on_page[f"shoal.{inside.group(1).replace('/', '.')}"] = _row_levels(checks)
    inner = {container: levels for container, levels in contracts.items() if container != "shoal"}
    assert sorted(on_page) == sorted(inner), "the packages with a layers row differ from pyproject's containers"
    wrong = {c: (on_page[c], inner[c]) for c in inner if on_page[c] != inner[c]}
    assert not wrong, f"(page, pyproject) levels, highest first: {wrong}"


def test_the_table_has_one_row_per_contract():
    rows = _page_contract_rows(PAGE.read_text())
    assert len(rows) == len(_contracts()), [contract for contract, _ in rows]
    assert any(contract == "layers (`shoal`)" for contract, _ in rows)
