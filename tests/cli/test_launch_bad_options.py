"""Every ``shoal launch`` form answers an unknown option with one line and a HINT naming its own
``--help``, not argparse's usage block (real processes: what a user's shell shows)."""

from __future__ import annotations

import pytest

from conftest import run_shoal


@pytest.mark.parametrize("form", [["k8s"], ["slurm"], ["runai"], ["mpirun"], ["manual"], ["--hosts", "localhost:2"]])
def test_an_unknown_option_is_one_line_and_a_hint(form, tmp_path):
    proc = run_shoal("launch", *form, "--no-such-flag", "--", "train.py", cwd=tmp_path, timeout=60)
    name = "shoal launch" + (f" {form[0]}" if not form[0].startswith("--") else "")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "shoal: error: unknown flag --no-such-flag",
        f"HINT: see `{name} --help`",
    ]
    assert list(tmp_path.iterdir()) == []  # nothing written
