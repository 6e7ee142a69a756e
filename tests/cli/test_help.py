"""Every ``--help`` answers without importing torch (the CLI's light path), and ends in examples."""

from __future__ import annotations

import json
import os
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


def test_shoal_runs_flags_are_torchruns_as_installed():
    """``shoal run`` parses with torchrun's flags frozen in ``shoal.cli.run.torchrun_flags`` (torch's parser
    costs seconds of import): they must be what torchrun's parser declares now. A torch release
    that adds, drops or changes a flag fails here; write them again with ``python -m shoal.cli.run.args``."""
    from shoal.cli.run import torchrun_flags as frozen
    from shoal.cli.run.args import torchrun_flags

    assert torchrun_flags() == frozen.FLAGS, "torchrun's flags changed: regenerate with `python -m shoal.cli.run.args`"


ARGVS = [
    ["train.py"],
    ["--nproc-per-node", "3", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "t.py", "--lr", "1"],
    ["--nproc_per_node=2", "--rdzv-backend", "c10d", "--rdzv_endpoint", "h:29400", "--rdzv-conf", "a=1", "-m", "pkg"],
    ["--standalone", "--max-restarts", "3", "--monitor-interval", "0.5", "--start-method", "fork", "t.py"],
    ["--no-python", "--log-dir", "d", "-r", "3", "-t", "0:1", "--duplicate-stdout-filters", "a,,b,c", "prog", "x"],
    [
        "--numa-binding",
        "node",
        "--signals-to-handle",
        "SIGTERM",
        "--shutdown-timeout",
        "5",
        "--virtual-local-rank",
        "t.py",
    ],
]


@pytest.mark.parametrize("argv", ARGVS, ids=lambda a: " ".join(a)[:40])
def test_shoal_run_parses_as_torchrun_does(argv, monkeypatch):
    """What torch's ``config_from_args`` reads is the same from shoal run's torch-free parser as from torchrun's."""
    from torch.distributed.run import get_args_parser

    from shoal.cli.parser import ArgumentParser
    from shoal.cli.run.args import LEFT_OUT, build_parser

    for name in [name for name in os.environ if name.startswith("PET_")]:
        monkeypatch.delenv(name)
    torchrun = vars(get_args_parser().parse_args(argv))
    ours = vars(build_parser(ArgumentParser).parse_args(argv))
    assert {k: v for k, v in ours.items() if k in torchrun} == {k: v for k, v in torchrun.items() if k not in LEFT_OUT}


def test_shoal_run_help_says_what_shoal_does(capsys):
    """torchrun's help where it is false for shoal run is shoal's (issue 49): the port, the run directory."""
    from shoal.cli.main import main

    assert main(["run", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Defaults to 29500" not in text and "default: a free one, picked by shoal" in text
    assert "--print-completion" not in text and "torchrun to stdout" not in text
    assert "--log-dir DIR, --log_dir DIR the run directory, kept after the run" in text
    assert "progress/ (what `shoal status DIR` reads)" in text
    assert "--nproc N, --nproc-per-node N, --nproc_per_node N workers on this node" in text
    assert "--nnodes N|MIN:MAX, --nodes N|MIN:MAX number of nodes" in text


def test_help_after_the_script_is_the_scripts():
    from shoal.cli.run import asks_for_help

    assert asks_for_help(["--help"]) and asks_for_help(["--standalone", "-h", "train.py"])
    assert not asks_for_help(["train.py", "--help"]) and not asks_for_help([])
