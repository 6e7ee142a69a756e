"""Every ``--help`` answers without importing torch (the CLI's light path), and ends in examples."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

COMMANDS = [
    [],
    ["run"],
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


def test_shoal_run_help_is_torchruns_parser_as_installed():
    """``shoal run --help`` prints a frozen text (torch's parser costs seconds of import): it must be
    what torchrun's parser, with shoal's additions, says now. A torch release that adds, drops or
    rewords a flag fails here; write the text again with ``python -m shoal.launch.run``."""
    from shoal.launch import run_help
    from shoal.launch.run import HELP_WIDTH, build_parser

    now = build_parser(width=HELP_WIDTH).format_help()
    assert now == run_help.TEXT, "torchrun's flags changed: regenerate with `python -m shoal.launch.run`"
    for flag in ("--nproc-per-node", "--rdzv-endpoint", "--master-addr", "--max-restarts", "--join-timeout"):
        assert flag in run_help.TEXT


def test_help_after_the_script_is_the_scripts():
    from shoal.cli.run import asks_for_help

    assert asks_for_help(["--help"]) and asks_for_help(["--standalone", "-h", "train.py"])
    assert not asks_for_help(["train.py", "--help"]) and not asks_for_help([])
