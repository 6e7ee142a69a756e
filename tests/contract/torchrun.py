"""Run ``scripts/torchrun_contract.py`` anywhere and check what it reports.

The script checks each rank's torchrun variables and their consistency across ranks itself;
:func:`check_report` adds what only the test knows: how many ranks and nodes the path was asked for.
"""

from __future__ import annotations

import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "scripts" / "torchrun_contract.py"
MARKER = "torchrun-contract: "


def report_from_output(output: str) -> dict:
    """The JSON report rank 0 printed (the last ``torchrun-contract:`` line of ``output``)."""
    lines = [line.split(MARKER, 1)[1] for line in output.splitlines() if MARKER in line]
    assert lines, f"no {MARKER.strip()} line in the output:\n{output[-3000:]}"
    return json.loads(lines[-1])


def report_from_file(path: Path) -> dict:
    assert path.exists(), f"the contract script wrote no report at {path}"
    return json.loads(path.read_text())


def check_report(report: dict, *, world: int, nodes: int, restarts: int = 0) -> list[dict]:
    """Assert the contract held on ``world`` ranks over ``nodes`` nodes; return the ranks' views."""
    assert report["problems"] == [], report["problems"]
    ranks = report["ranks"]
    assert [int(v["RANK"]) for v in ranks] == list(range(world))
    assert {v["WORLD_SIZE"] for v in ranks} == {str(world)}
    assert {v["GROUP_WORLD_SIZE"] for v in ranks} == {str(nodes)}
    assert len({v["GROUP_RANK"] for v in ranks}) == nodes
    assert {v["TORCHELASTIC_MAX_RESTARTS"] for v in ranks} == {str(restarts)}
    assert {v["TORCHELASTIC_RESTART_COUNT"] for v in ranks} == {"0"}
    return ranks
