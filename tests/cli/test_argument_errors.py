"""Every command's argument errors (issue 49): said before torch loads, naming the flag as the user
typed it, with "did you mean" for a near miss and the ``--help`` of the command given. Real
commands as a user types them, each in a fresh interpreter whose imports are reported
(``PYTHONPROFILEIMPORTTIME``: a warm start would hide them)."""

from __future__ import annotations

import re

import pytest

from conftest import run_shoal

TORCH = re.compile(r"^import time:.*\|\s+torch$", re.M)
"""``import torch`` in ``-X importtime``'s lines."""

CASES = [
    (
        ["run", "--nrpoc", "2", "x.py"],
        ["shoal: error: unknown flag --nrpoc", "HINT: did you mean --nproc? (see `shoal run --help`)"],
    ),
    (
        ["run", "--nproc", "two", "x.py"],
        [
            "shoal: error: --nproc 'two' is neither a number of processes nor auto/gpu",
            "HINT: give the number of worker processes, e.g. --nproc 2, or --nproc auto (one per GPU)",
        ],
    ),
    (
        ["run", "--nproc-per-node=two", "x.py"],
        [
            "shoal: error: --nproc-per-node 'two' is neither a number of processes nor auto/gpu",
            "HINT: give the number of worker processes, e.g. --nproc-per-node 2, or --nproc-per-node auto (one per GPU)",
        ],
    ),
    (
        ["run", "--nproc", "2"],
        [
            "shoal: error: no script given: shoal run starts SCRIPT (or -m MODULE) as N workers",
            "HINT: put the script after the flags, e.g. `shoal run --nproc 2 train.py --lr 0.1` "
            "(see `shoal run --help`)",
        ],
    ),
    (
        ["run", "--nodes", "2:1", "x.py"],
        ["shoal: error: --nodes '2:1' is not N or MIN:MAX (1 <= MIN <= MAX)", "HINT: see `shoal run --help`"],
    ),
    (
        ["run", "--start-method", "spwan", "x.py"],
        [
            "shoal: error: --start-method 'spwan' is not one of: spawn, fork, forkserver",
            "HINT: did you mean --start-method spawn?",
        ],
    ),
    (
        ["run", "--master_port", "abc", "x.py"],
        ["shoal: error: --master_port 'abc' is not a whole number", "HINT: see `shoal run --help`"],
    ),
    (
        ["train", "digits", "--nprocs", "2"],
        ["shoal: error: unknown flag --nprocs", "HINT: did you mean --nproc? (see `shoal train --help`)"],
    ),
    (
        ["train", "digits", "--nproc-per-node", "two"],
        ["shoal: error: --nproc-per-node 'two' is not a whole number", "HINT: see `shoal train --help`"],
    ),
    (
        ["launch", "slurm", "--nodes", "two", "--", "x.py"],
        ["shoal: error: --nodes 'two' is not a whole number", "HINT: see `shoal launch slurm --help`"],
    ),
    (
        ["launch", "manual", "--hosts", "a:1", "--rdzv", "etcd", "--", "x.py"],
        ["shoal: error: --rdzv 'etcd' is not one of: static, c10d", "HINT: choose one of: static, c10d"],
    ),
    (
        ["env", "--device", "cdua"],
        ["shoal: error: --device 'cdua' is not one of: auto, cpu, cuda", "HINT: did you mean --device cuda?"],
    ),
    (
        ["doctor", "--hang-timeout", "5"],
        ["shoal: error: unknown flag --hang-timeout", "HINT: see `shoal doctor --help`"],
    ),
    (
        ["bench", "scaling", "--wrold-sizes", "1,2"],
        [
            "shoal: error: unknown flag --wrold-sizes",
            "HINT: did you mean --world-sizes? (see `shoal bench scaling --help`)",
        ],
    ),
    (
        ["demo", "all-reduce", "--nproc", "0"],
        [
            "shoal: error: --nproc must be at least 1, got 0",
            "HINT: give --nproc 1 or more (see `shoal demo all-reduce --help`)",
        ],
    ),
    (
        ["train", "digits", "--nproc-per-node", "0"],
        [
            "shoal: error: --nproc-per-node must be at least 1, got 0",
            "HINT: give --nproc-per-node 1 or more (see `shoal train --help`)",
        ],
    ),
    (
        ["train", "digits", "--nodes", "2:1"],
        ["shoal: error: --nodes '2:1' is not N or MIN:MAX (1 <= MIN <= MAX)", "HINT: see `shoal train --help`"],
    ),
    (
        ["env", "--nproc", "0"],
        ["shoal: error: --nproc must be at least 1, got 0", "HINT: give --nproc 1 or more (see `shoal env --help`)"],
    ),
    (
        ["launch", "k8s", "--image", "img", "--nodes", "0", "--", "x.py"],
        [
            "shoal: error: --nodes must be at least 1, got 0",
            "HINT: give --nodes 1 or more (see `shoal launch k8s --help`)",
        ],
    ),
]


@pytest.mark.parametrize("argv, lines", CASES, ids=[" ".join(argv) for argv, _ in CASES])
def test_an_argument_error_is_one_line_and_a_hint_before_torch_loads(argv, lines, tmp_path):
    (tmp_path / "x.py").write_text("print('hi')\n")
    result = run_shoal(*argv, cwd=tmp_path, timeout=120, env={"PYTHONPROFILEIMPORTTIME": "1"})
    said = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    assert result.returncode == 2, result.stderr
    assert said == lines
    assert not TORCH.search(result.stderr), f"`shoal {' '.join(argv)}` imported torch before its error"
    assert result.stdout == "" and sorted(p.name for p in tmp_path.iterdir()) == ["x.py"]
