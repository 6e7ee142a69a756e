"""Horovod's own test files, run against shoal.horovod under ``mpirun -np 2``; a tally of what passes.

Horovod's code is never part of this repository: the test files come, at test time, from a Horovod
0.28.1 source tree the machine already has, named by ``SHOAL_HOROVOD_SOURCE`` (a checkout whose
work tree holds ``test/parallel/``, or a git directory with the tag ``v0.28.1``). Without it the
tests that need them skip, saying so. The files' imports are met by the opt-in shim
(``python -m shoal.horovod.shim``: ``import horovod.tensorflow`` is shoal's) and by a two-function
stand-in for Horovod's ``test/utils/common.py`` written here (the rest of that file needs Horovod's
runner, cloudpickle and mock).

Each rank runs the file under pytest with a per-test timeout and writes a JUnit file; a test passes
when it passes on every rank. Run by hand for the table::

    SHOAL_HOROVOD_SOURCE=PATH python tests/horovod/horovod_upstream.py test_tensorflow.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

RELEASE = "v0.28.1"
SOURCE_VARIABLE = "SHOAL_HOROVOD_SOURCE"
HELPERS = {
    "test_tensorflow.py": ["base_test_tensorflow.py"],
    "test_torch.py": [],
}
"""Each runnable test file and the files of test/parallel it imports."""

RANK_SCRIPT = Path(__file__).parent / "scripts" / "hvd_upstream_rank.py"

COMMON = '''"""Stand-in for Horovod's test/utils/common.py: the two helpers the test files import."""
import os


def mpi_env_rank_and_size():
    for rank, size in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if os.environ.get(rank) is not None and os.environ.get(size) is not None:
            return int(os.environ[rank]), int(os.environ[size])
    return 0, 1


def skip_or_fail_gpu_test(test, message):
    if int(os.environ.get("HOROVOD_TEST_GPU", 0)):
        test.fail(message)
    else:
        test.skipTest(message)
'''


def source() -> Path | None:
    """The Horovod source tree or git directory named by SHOAL_HOROVOD_SOURCE, or None."""
    value = os.environ.get(SOURCE_VARIABLE)
    return Path(value) if value and Path(value).exists() else None


def _read(root: Path, relative: str) -> str:
    work_tree = root / relative
    if work_tree.is_file():
        return work_tree.read_text()
    git_dir = root / ".git" if (root / ".git").exists() else root
    return subprocess.run(
        ["git", "--git-dir", str(git_dir), "show", f"{RELEASE}:{relative}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def prepare(root: Path, test_file: str, into: Path) -> Path:
    """Horovod's ``test/parallel/<test_file>`` (and what it imports) laid out under ``into``; its path."""
    parallel, utils = into / "parallel", into / "utils"
    parallel.mkdir(parents=True, exist_ok=True)
    utils.mkdir(parents=True, exist_ok=True)
    for name in [test_file, *HELPERS[test_file]]:
        (parallel / name).write_text(_read(root, f"test/parallel/{name}"))
    (utils / "common.py").write_text(COMMON)
    return parallel / test_file


@dataclass
class Tally:
    """Per test (``Class::name``): 'passed', 'skipped' or 'failed: <first line of the error>'."""

    outcomes: dict[str, str] = field(default_factory=dict)

    @property
    def ran(self) -> list[str]:
        return [name for name, outcome in self.outcomes.items() if outcome != "skipped"]

    @property
    def passed(self) -> list[str]:
        return [name for name, outcome in self.outcomes.items() if outcome == "passed"]

    def summary(self) -> str:
        counts = Counter(outcome.split(":")[0] for outcome in self.outcomes.values())
        return f"{len(self.passed)} of {len(self.ran)} CPU tests that ran passed ({counts['skipped']} skipped)"


def _outcomes(junit: Path) -> dict[str, str]:
    found = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            text = (problem.get("message") or problem.text or "").strip().splitlines()
            found[name] = "failed: " + (text[0] if text else "no message")
        elif case.find("skipped") is not None:
            found[name] = "skipped"
        else:
            found[name] = "passed"
    return found


def combine(per_rank: list[dict[str, str]], expected: list[str]) -> Tally:
    """One outcome per test: passed on every rank, skipped on every rank, else the first failure;
    a test a rank never reported (its run died) fails as 'not reported by rank r'. A test no rank
    reported is missing from ``expected``: the run died before it (mpirun's exit status says so)."""
    tally = Tally()
    for name in expected:
        seen = [outcomes.get(name, f"failed: not reported by rank {r}") for r, outcomes in enumerate(per_rank)]
        if all(outcome == "passed" for outcome in seen):
            tally.outcomes[name] = "passed"
        elif all(outcome == "skipped" for outcome in seen):
            tally.outcomes[name] = "skipped"
        else:
            tally.outcomes[name] = (
                next(o for o in seen if o.startswith("failed"))
                if any(o.startswith("failed") for o in seen)
                else "failed: skipped on some ranks only"
            )
    return tally


_WORDS = {"PASSED", "FAILED", "SKIPPED", "ERROR", "SUBPASSED", "SUBFAILED", "SUBSKIPPED"}


def _logged(log: Path) -> dict[str, str]:
    """Each test's outcome from a rank's verbose pytest log (written as it goes: complete up to a
    crash). Horovod runs each test as two subtests (graph, eager): a test is skipped when every
    subtest skipped, failed when any failed, though pytest then still reports the test PASSED."""
    words: dict[str, list[str]] = {}
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        parts = line.split()
        if len(parts) >= 2 and parts[0].count("::") == 2:
            word = parts[1].split("[")[0]
            if word in _WORDS:
                words.setdefault(parts[0].split("::", 1)[1], []).append(word)
    found = {}
    for name, seen in words.items():
        subs = [w for w in seen if w.startswith("SUB")]
        if any(w in ("FAILED", "ERROR", "SUBFAILED") for w in seen):
            found[name] = "failed: see the rank's log"
        elif "SKIPPED" in seen or (subs and all(w == "SUBSKIPPED" for w in subs)):
            found[name] = "skipped"
        elif "PASSED" in seen:
            found[name] = "passed"
    return found


def _rank_outcomes(workdir: Path, rank: int) -> dict[str, str]:
    """The log's outcomes, with the JUnit file's first line of each failure where it has one."""
    found = _logged(workdir / f"rank{rank}.log")
    junit = workdir / f"rank{rank}.xml"
    messages = _outcomes(junit) if junit.exists() else {}
    for name, outcome in found.items():
        if outcome.startswith("failed") and messages.get(name, "").startswith("failed"):
            found[name] = messages[name]
    return found


def run(test_file: str, workdir: Path, *, np: int = 2, per_test_timeout: int = 300, total_timeout: int = 5400,
        select: str | None = None) -> tuple[Tally, subprocess.CompletedProcess]:  # fmt: skip
    """Run Horovod's ``test_file`` under ``mpirun -np np`` against shoal.horovod; the tally and the run."""
    root = source()
    if root is None:
        raise RuntimeError(f"{SOURCE_VARIABLE} names no Horovod source tree")
    test_path = prepare(root, test_file, workdir)
    from horovod_launch import clean_env  # the suite's helper (its directory is on sys.path)

    from shoal.horovod import shim
    from shoal.launch.ports import find_free_port

    env = clean_env(
        PYTHONPATH=os.pathsep.join([shim.path(), str(Path(__file__).resolve().parents[2] / "src")]),
        TF_CPP_MIN_LOG_LEVEL="2",
        SHOAL_TIMEOUT=str(per_test_timeout // 2),  # a mismatched collective fails before the test's timeout
        CUDA_VISIBLE_DEVICES="",
    )
    command = [
        "mpirun", "-np", str(np), "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
        "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={find_free_port()}",
        "-x", "PATH", "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", "-x", "TF_CPP_MIN_LOG_LEVEL", "-x", "SHOAL_TIMEOUT",
        "-x", "CUDA_VISIBLE_DEVICES",
        sys.executable, str(RANK_SCRIPT), str(workdir), str(test_path), str(per_test_timeout), select or "",
    ]  # fmt: skip
    proc = subprocess.run(command, cwd=test_path.parent, env=env, capture_output=True, text=True,
                          timeout=total_timeout)  # fmt: skip
    per_rank = [_rank_outcomes(workdir, r) for r in range(np)]
    expected = sorted({name for outcomes in per_rank for name in outcomes})
    return combine(per_rank, expected), proc


def main(argv: list[str]) -> int:
    import tempfile

    test_file = argv[0] if argv else "test_tensorflow.py"
    select = argv[1] if len(argv) > 1 else None
    sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]
    with tempfile.TemporaryDirectory() as tmp:
        tally, proc = run(test_file, Path(tmp), select=select)
    for name, outcome in sorted(tally.outcomes.items()):
        print(f"{outcome.split(':')[0]:8} {name}" + (f"  {outcome.split(':', 1)[1].strip()}" if ":" in outcome else ""))
    print(tally.summary())
    if proc.returncode not in (0, 1):
        print(f"mpirun exit {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[:6000]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
