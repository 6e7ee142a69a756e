"""``shoal run``'s command line (:mod:`shoal.cli.run`): torchrun's flags and shoal's, their errors
in one line with a HINT, a missing script or program, the pod's variables as the flags' defaults.

Everything here fails, or is parsed, before anything is launched: in-process, no worker starts.
"""

from __future__ import annotations

import re

import pytest

from conftest import run_shoal
from shoal.cli.main import main
from shoal.cli.run import args as run_args
from shoal.cli.run.precheck import check_run_args
from shoal.errors import ShoalError

SCRIPT = __file__  # a script that exists; none of these tests runs it


def _main_run(capsys, *args: str) -> tuple[int, str]:
    code = main(["run", *args])
    return code, capsys.readouterr().err


def test_script_not_found(capsys, tmp_path):
    missing = str(tmp_path / "nope.py")
    code, err = _main_run(capsys, "--nproc", "2", missing)
    assert code == 2
    assert f"shoal: error: script not found: {missing}" in err
    assert "HINT: " in err and "-m" in err


@pytest.mark.parametrize(
    "flags, named",
    [(["--nproc", "0"], "--nproc"), (["--nproc_per_node=0"], "--nproc_per_node"), (["--nproc", "-1"], "--nproc")],
)
def test_nproc_below_one(capsys, flags, named):
    code, err = _main_run(capsys, *flags, SCRIPT)
    assert code == 2
    value = flags[-1].split("=")[-1]
    assert err.splitlines() == [
        f"shoal: error: {named} must be at least 1, got {value}",
        "HINT: give the number of worker processes, e.g. 2",
    ]


def test_nproc_and_nproc_per_node_disagree(capsys):
    code, err = _main_run(capsys, "--nproc", "2", "--nproc-per-node", "3", SCRIPT)
    assert code == 2 and "disagree" in err


def test_unknown_flag_is_one_line(capsys):
    code, err = _main_run(capsys, "--no-such-flag", SCRIPT)
    assert code == 2
    assert err.splitlines() == [
        "shoal: error: unknown flag --no-such-flag",
        "HINT: see `shoal run --help`",
    ]


def test_modules_are_not_checked_programs_are():
    parse = run_args.build_parser().parse_args
    check_run_args(parse(["-m", "no.such.module"]))  # the worker reports it
    check_run_args(parse(["--no-python", "true"]))  # found on PATH
    with pytest.raises(ShoalError, match="program not found: no-such-program"):
        check_run_args(parse(["--no-python", "no-such-program"]))
    with pytest.raises(ShoalError, match="script not found: no_such_script.py"):
        check_run_args(parse(["no_such_script.py"]))


def test_help_shows_torchruns_flags_shoals_and_examples(capsys):
    assert main(["run", "--help"]) == 0  # the frozen text (tests/cli/test_help.py checks it is torch's)
    out = capsys.readouterr().out
    for text in (
        "usage: shoal run",
        "--nproc N",
        "--nproc-per-node",
        "--nproc_per_node",
        "--master-port",
        "--rdzv-endpoint",
        "--standalone",
        "--join-timeout",
        "examples:",
    ):
        assert text in out


def test_listed_in_shoal_help():
    proc = run_shoal("--help", timeout=60)
    assert proc.returncode == 0 and re.search(r"^\s+run\s+launch a script", proc.stdout, re.M)


RUNAI_POD = {"MASTER_ADDR": "dist-train1-master-0", "MASTER_PORT": "23456", "RANK": "1", "WORLD_SIZE": "2"}


def test_in_a_pod_with_only_the_classic_variables_they_are_the_flags_defaults():
    _, options = run_args.parse(["train.py"], environ=RUNAI_POD)
    assert (options.nnodes, options.node_rank, options.rdzv_backend) == ("2", 1, "static")
    assert (options.master_addr, options.master_port, options.nproc) == ("dist-train1-master-0", 23456, 1)
    _, options = run_args.parse(["--nproc", "3", "--master-port", "29999", "train.py"], environ=RUNAI_POD)
    assert (options.nproc, options.master_port, options.nnodes) == (3, 29999, "2")  # flags given win
    _, options = run_args.parse(["--standalone", "train.py"], environ=RUNAI_POD)
    assert not options.several_nodes
    _, options = run_args.parse(["train.py"], environ={})  # elsewhere: a standalone job, as before
    assert not options.several_nodes and options.master_port is None
