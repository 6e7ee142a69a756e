"""Every ``--help`` answers without importing torch (the CLI's light path), and ends in examples."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

COMMANDS = [
    [],
    ["train"],
    ["env"],
    ["demo", "all-reduce"],
    ["launch"],
    ["launch", "k8s"],
    ["launch", "slurm"],
    ["bench"],
    ["bench", "scaling"],
    ["doctor"],
]

PROBE = """
import contextlib, io, json, sys
from shoal.cli.main import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        main(sys.argv[1:] + ["--help"])
    except SystemExit:
        pass
print(json.dumps({"torch": "torch" in sys.modules, "help": out.getvalue()}))
"""


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "shoal")
def test_help_imports_no_torch_and_shows_examples(command):
    proc = subprocess.run([sys.executable, "-c", PROBE, *command], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert not result["torch"], f"`shoal {' '.join(command)} --help` imported torch"
    assert "usage: shoal" in result["help"] and "example" in result["help"], result["help"][-600:]
