"""``make test-gpu``: every GPU-marked test and a short CUDA benchmark set, in one command, one report.

Made for a GPU machine lent for minutes (docs/GPU.md): its ``python3`` holds torch with CUDA,
torchvision, numpy and pytest, and it reaches no package registry. This command

1. puts shoal in (``pip install --no-deps --no-build-isolation -e .``: no registry for a build
   backend either; when that fails, ``PYTHONPATH=src`` for every command it starts);
2. runs every test marked ``gpu`` (``pytest -m gpu`` over the files that hold them: the other test
   files import packages such a machine may lack), without pytest-xdist or pytest-timeout
   (``-o addopts=``; a time limit only when pytest-timeout is there);
3. runs the benchmark set (:mod:`bench_set`), each figure against its baseline from the same run;
4. writes ``gpu-report.json`` and ``gpu-report.md`` into ``--out`` with the device, driver, CUDA,
   torch and NCCL versions.

Without CUDA it says so in one line and exits 2. ``--dry-run`` starts nothing that trains: it
lists what would run and checks that every part can (imports, scripts, torchrun, the GPU tests
collected), exit 1 if one cannot. ``--rehearse`` runs the benchmark set on the CPU at tiny sizes
(the pipeline and the report, not the figures: CI runs it). Exit 0 when every test passed and every
part ran; 1 otherwise (the report says what failed).

    python3 scripts/gpu/check.py --out gpu-report      # on the GPU machine (make test-gpu)
    python3 scripts/gpu/check.py --dry-run             # anywhere: what would run, and can it
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import bench_set
from steps import ROOT, Step, run_step, write_report

BUDGET_S = 450.0
"""Seconds for the whole command (installs, tests, benchmarks): the issue's 8 minutes less a margin."""
TESTS_SHARE = 0.55
"""Of the budget, what the tests may take (a limit, not a reservation); the benchmarks get the rest."""
IMPORTS = ("torch", "torchvision", "numpy", "sklearn", "tqdm", "yaml", "pytest")
"""What shoal's own dependencies and the tests need on the machine (nothing can be installed there)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "gpu-check", help="where the report goes")
    parser.add_argument("--dry-run", action="store_true", help="list what would run and check it can")
    parser.add_argument("--rehearse", action="store_true", help="the benchmark set on the CPU, tiny sizes")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for everything (default 450)")
    parser.add_argument("--no-tests", action="store_true", help="the benchmarks only")
    args = parser.parse_args(argv)
    started = time.monotonic()
    deadline = started + args.budget
    env = _environment()
    facts = _facts(env)
    device = "cpu" if args.rehearse else "cuda"
    nproc = facts.get("gpus", 1) if device == "cuda" else 1
    test_files = gpu_test_files()
    plan = [] if args.no_tests or args.rehearse else [_tests_step(test_files, args.out, args.budget * TESTS_SHARE)]
    plan += bench_set.steps(device, args.out, nproc)
    if args.dry_run:
        return dry_run(plan, test_files, env, facts)
    if not facts.get("cuda") and not args.rehearse:
        why = facts.get("why") or facts.get("error", "torch could not tell")
        print(
            f"gpu-check: no CUDA here ({why}): nothing to prove on this machine; --dry-run checks the parts",
            file=sys.stderr,
        )
        return 2
    notes = [_install(env)] if not args.rehearse else []
    args.out.mkdir(parents=True, exist_ok=True)
    bench_set.prepare(args.out)
    results = []
    for step in plan:
        results.append(run_step(step, env, deadline))
        print(f"gpu-check: {step.name}: {results[-1]['status']} in {results[-1]['seconds']:.0f} s", flush=True)
    tests = _test_results(args.out / "gpu-tests.xml") if plan and plan[0].name == "tests" else None
    figures, bench_notes = bench_set.figures({r["name"]: r for r in results}, args.out, facts)
    report = {
        "command": " ".join(["scripts/gpu/check.py", *(argv if argv is not None else sys.argv[1:])]),
        "rehearsal": args.rehearse,
        "seconds": round(time.monotonic() - started, 1),
        "machine": facts,
        "tests": tests,
        "figures": figures,
        "steps": results,
        "notes": [n for n in notes if n] + bench_notes,
    }
    paths = write_report(report, args.out)
    print(f"gpu-check: wrote {paths[0]} and {paths[1]} ({report['seconds']:.0f} s)")
    required = {step.name for step in plan if step.required}
    failed = [r["name"] for r in results if r["status"] != "ok" and r["name"] in required]
    if tests and (tests["failed"] or tests["errors"]):
        failed.append(f"{tests['failed'] + tests['errors']} test(s)")
    if failed:
        print(f"gpu-check: FAILED: {', '.join(failed)} (see {paths[1]})", file=sys.stderr)
        return 1
    return 0


def gpu_test_files() -> list[str]:
    """The test files holding a ``gpu`` mark (found by text: importing them needs their packages)."""
    mark = re.compile(r"pytest\.mark\.gpu\b")
    files = [p for p in sorted((ROOT / "tests").rglob("test_*.py")) if mark.search(p.read_text(errors="replace"))]
    return [str(p.relative_to(ROOT)) for p in files]


def _tests_step(files: list[str], out: Path, budget: float) -> Step:
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", *_pytest_options(), "--junitxml", str(out / "gpu-tests.xml")]
    return Step("tests", [*cmd, *files], timeout=budget, what="every gpu-marked test")


def _pytest_options() -> list[str]:
    """pyproject's addopts dropped (``--durations`` is harmless, but nothing else may be assumed
    there); markers still strict; pytest-timeout's limit only where it is installed."""
    options = ["-o", "addopts=", "--strict-markers", "-rA", "-q", "-p", "no:cacheprovider"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        options.append("--timeout=300")
    return options


def dry_run(plan: list[Step], test_files: list[str], env: dict[str, str], cuda: dict) -> int:
    """Print each step and whether it can run; 1 if any cannot."""
    problems = []
    for name in IMPORTS:
        if importlib.util.find_spec(name) is None:
            problems.append(f"python module {name!r} is not importable by {sys.executable}")
    for step in plan:
        print(f"{step.name}: {step.what}\n  $ {step.shell()}")
        problems += [f"{step.name}: {p}" for p in step.check()]
    problems += _check_shoal(env)
    problems += _check_collected(test_files, env)
    print(
        f"CUDA: {'yes, ' + str(cuda.get('device')) if cuda.get('cuda') else 'no (' + cuda.get('why', cuda.get('error', '?')) + '): the real run needs it'}"
    )
    for problem in problems:
        print(f"gpu-check: cannot run: {problem}", file=sys.stderr)
    print(
        f"gpu-check: dry run: {len(plan)} step(s), {'all runnable' if not problems else f'{len(problems)} problem(s)'}"
    )
    return 1 if problems else 0


def _check_shoal(env: dict[str, str]) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", "import shoal, shoal.bench.allreduce, benchmarks.memory; print(shoal.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,  # benchmarks/ beside the package: imported from the repository root
    )
    if done.returncode != 0:
        return [f"shoal does not import: {done.stderr.strip().splitlines()[-1:]}"]
    return []


def _check_collected(files: list[str], env: dict[str, str]) -> list[str]:
    """The GPU tests collect (their imports resolve, their markers are declared): listed by id."""
    if not files:
        return ["no test file holds a gpu mark"]
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-m", "gpu", *_pytest_options(), *files]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    print(f"tests: {len(ids)} gpu-marked test(s) collected from {len(files)} file(s)")
    for test_id in ids:
        print(f"  {test_id}")
    if done.returncode != 0 or not ids:
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        return [f"pytest could not collect the gpu tests: {' | '.join(tail)}"]
    return []


def _environment() -> dict[str, str]:
    """Every command's: shoal importable from src/ (installed or not), each test command started in a
    fresh interpreter (tests/warm.py's servers are a CPU-machine saving), no Python bytecode litter."""
    env = dict(os.environ)
    src = str(ROOT / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    env["SHOAL_TEST_FRESH"] = "1"
    return env


def _facts(env: dict[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu" / "facts.py")], capture_output=True, text=True, env=env
    )
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"cuda": False, "error": (done.stderr.strip().splitlines() or ["facts.py printed nothing"])[-1]}


def _install(env: dict[str, str]) -> str | None:
    """``pip install --no-deps --no-build-isolation -e .`` (the ``shoal`` command on PATH); a note
    when it fails (PYTHONPATH still makes ``python -m shoal`` work)."""
    if shutil.which("shoal", path=env.get("PATH")):
        return None
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "-e", str(ROOT)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    except subprocess.TimeoutExpired:
        return "pip install -e . took over 120 s and was stopped; shoal ran from src/ through PYTHONPATH"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return f"pip install -e . failed ({last}); shoal ran from src/ through PYTHONPATH"
    return None


def _test_results(path: Path) -> dict | None:
    """Counts and the failing tests' ids, from pytest's JUnit XML."""
    if not path.is_file():
        return None
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    cases = []
    for case in suite.iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = child.tag
                reason = (child.get("message") or "").splitlines()[:1]
        test_id = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        cases.append(
            {"id": test_id, "outcome": outcome, **({"reason": reason[0]} if outcome != "passed" and reason else {})}
        )
    count = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failure", "error", "skipped")}
    return {
        "passed": count["passed"],
        "failed": count["failure"],
        "errors": count["error"],
        "skipped": count["skipped"],
        "seconds": float(suite.get("time", "nan")),
        "cases": cases,
    }


if __name__ == "__main__":
    sys.exit(main())
