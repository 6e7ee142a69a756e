"""Run ``shoal doctor`` (or any ``shoal`` command) on the pods of :mod:`cluster.pods`, one per node,
and read what each printed; make a second virtual environment with another shoal version."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cluster.helpers import clean_env
from cluster.pods import Pod

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Run:
    """One command on one pod: stdout and stderr in files of their own (stdout may be a JSON report)."""

    pod: Pod
    proc: subprocess.Popen
    out: Path
    err: Path
    started: float
    ended: float | None = None

    @property
    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    @property
    def elapsed(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    def report(self) -> dict:
        return json.loads(self.stdout)


def start(pod: Pod, args: Sequence[str], logs: Path, *, python: str = sys.executable, env: dict | None = None) -> Run:
    """``python -m shoal ARGS`` in ``pod``."""
    logs.mkdir(parents=True, exist_ok=True)
    out, err = logs / f"{pod.name}.out", logs / f"{pod.name}.err"
    with open(out, "w") as o, open(err, "w") as e:
        proc = pod.popen([python, "-m", "shoal", *args], stdout=o, stderr=e, env=env or clean_env(), cwd=logs)
    return Run(pod, proc, out, err, time.monotonic())


def wait(runs: Sequence[Run], timeout: float) -> list[Run]:
    """Wait for every run (one deadline); their whole output if one is still running after it."""
    deadline = time.monotonic() + timeout
    while any(run.ended is None for run in runs):
        for run in runs:
            if run.ended is None and run.proc.poll() is not None:
                run.ended = time.monotonic()
        if time.monotonic() > deadline:
            raise AssertionError(f"still running after {timeout} s:\n{describe(runs)}")
        time.sleep(0.1)
    return list(runs)


def describe(runs: Sequence[Run]) -> str:
    return "\n".join(
        f"===== {run.pod.name} rc={run.proc.returncode} after {run.elapsed:.1f} s\n"
        f"--- stdout\n{run.stdout[-5000:]}\n--- stderr\n{run.stderr[-3000:]}"
        for run in runs
    )


def other_shoal(directory: Path, version: str) -> str:
    """A virtual environment that shares this one's packages (torch...) through a ``.pth`` file but has
    its own shoal, a copy of this source at ``version``, installed with pip without the network.

    Returns its interpreter. Only this environment's site-packages is on its path (a ``.pth`` line
    adds a directory, not that directory's own ``.pth`` files), so this checkout's editable shoal
    stays out of it and the copy is what ``import shoal`` finds.
    """
    source = directory / "source"
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy(ROOT / "README.md", source / "README.md")
    pyproject = (ROOT / "pyproject.toml").read_text()
    init = source / "src" / "shoal" / "__init__.py"
    current = next(line for line in init.read_text().splitlines() if line.startswith("__version__"))
    (source / "pyproject.toml").write_text(pyproject.replace('version = "', f'version = "{version}"  # was "', 1))
    init.write_text(init.read_text().replace(current, f'__version__ = "{version}"'))
    venv = directory / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    Path(purelib, "shoal-test-shares-the-main-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index", str(source)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return python
