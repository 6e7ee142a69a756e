"""scripts/speed-gauge: `make test` and `make test-quick` run pytest between two gauge readings, report the time
against the budget at that speed, and keep pytest's exit status (a failing suite still fails make)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts/speed-gauge"


def _script():
    loader = importlib.machinery.SourceFileLoader("speed_gauge", str(SCRIPT))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def test_the_budget_holds_up_to_the_reference_gauge_and_grows_in_proportion_above():
    gauge = _script()
    assert gauge.budget_seconds(25, 0.9) == gauge.budget_seconds(25, 1.6) == 25 * 60
    assert gauge.budget_seconds(25, 3.2) == 50 * 60
    assert gauge.budget_seconds(3, 2.4) == pytest.approx(4.5 * 60)


def test_the_commands_exit_status_and_both_readings_come_back():
    """``json`` stands in for torch (the same measure, a fraction of the cost)."""
    failing = [sys.executable, "-c", "import sys; print('the suite ran'); sys.exit(3)"]
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--budget-min", "25", "--module", "json", "--", *failing],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 3, proc.stderr
    start, ran, summary = proc.stdout.splitlines()
    assert re.fullmatch(r"speed gauge at start: import json took \d+\.\d\d CPU-s", start), start
    assert ran == "the suite ran"
    assert re.match(r"make test: 0 min \d+ s \(the command 0 min \d+ s, exit status 3\); speed gauge \S+ CPU-s at start, \S+ at end: within the budget", summary), summary  # fmt: skip


def test_make_runs_pytest_under_the_gauge():
    makefile = (ROOT / "Makefile").read_text()
    for target, budget in (("test", "25"), ("test-quick", "3")):
        recipe = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", makefile, re.M).group(1)
        pytest_lines = [line for line in recipe.splitlines() if "-m pytest" in line]
        assert pytest_lines and all(f"$(GAUGE) --budget-min {budget} " in line for line in pytest_lines), recipe
