"""The GPU check's machinery: a step (one command with a time limit), running it, writing the report."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MIN_STEP_S = 10.0
"""A step that would get less than this before the deadline is not started (the report says so)."""


@dataclass(frozen=True)
class Step:
    """One command of the check: what it proves, its time limit, the paths it needs."""

    name: str
    cmd: list[str]
    timeout: float
    what: str
    needs: tuple[Path, ...] = field(default_factory=tuple)
    required: bool = True
    """False for a probe whose outcome is a finding, not a failure of the check."""

    def shell(self) -> str:
        """The command as one would type it (paths relative to the repository)."""
        words = [Path(w).name if w == sys.executable else w for w in self.cmd]
        return shlex.join(os.path.relpath(w, ROOT) if w.startswith(str(ROOT)) else w for w in words)

    def check(self) -> list[str]:
        """What stops this command from running here (nothing: [])."""
        problems = [f"{path.relative_to(ROOT)} is missing" for path in self.needs if not path.exists()]
        if self.cmd[:2] == [sys.executable, "-m"]:
            module = self.cmd[2]
            if not _module_found(module):
                problems.append(f"python -m {module}: no such module")
        return problems


def _module_found(name: str) -> bool:
    """Whether ``python -m NAME`` finds ``name`` where the steps run: from the repository root, which
    ``-m`` puts first on the path (the project's ``benchmarks`` live there, beside the package)."""
    sys.path.insert(0, str(ROOT))
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False
    finally:
        sys.path.remove(str(ROOT))


def run_step(step: Step, env: dict[str, str], deadline: float) -> dict:
    """Run ``step`` in its own process group, its output in ``LOG_DIR/NAME.log``; the outcome as a dict
    (status ok, failed, timed out, or not started for lack of time)."""
    result = {"name": step.name, "command": step.shell(), "seconds": 0.0}
    limit = min(step.timeout, deadline - time.monotonic())
    if limit < MIN_STEP_S:
        return {**result, "status": "not started: out of time"}
    started = time.monotonic()
    proc = subprocess.Popen(
        step.cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=limit)
        status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its own group: the workers it started go with it
        output, _ = proc.communicate()
        status = f"timed out after {limit:.0f} s"
    result.update(status=status, seconds=round(time.monotonic() - started, 1), output=output)
    if status != "ok":
        result["tail"] = output.strip().splitlines()[-15:]
    return result


def write_report(report: dict, out: Path) -> tuple[Path, Path]:
    """``gpu-report.json`` (every step's output in ``logs/``) and ``gpu-report.md`` in ``out``."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for step in report["steps"]:
        if "output" in step:
            (logs / f"{step['name']}.log").write_text(step.pop("output"))
    json_path, md_path = out / "gpu-report.json", out / "gpu-report.md"
    json_path.write_text(json.dumps(report, indent=1, default=str) + "\n")
    md_path.write_text(markdown(report))
    return json_path, md_path


def markdown(report: dict) -> str:
    m = report["machine"]
    kind = "REHEARSAL on the CPU (tiny sizes: the figures mean nothing)" if report["rehearsal"] else "CUDA run"
    lines = [
        f"# GPU check: {kind}",
        "",
        f"`{report['command']}`, {report['seconds']:.0f} s in all.",
        "",
        "| device | GPUs | memory | driver | CUDA | torch | NCCL | cuDNN | Python |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        "| {} | {} | {} GiB | {} | {} | {} | {} | {} | {} |".format(
            *(
                m.get(k, "-")
                for k in ("device", "gpus", "memory_gib", "driver", "cuda_build", "torch", "nccl", "cudnn", "python")
            )
        ),
        "",
    ]
    tests = report.get("tests")
    if tests:
        lines += [
            f"## GPU tests: {tests['passed']} passed, {tests['failed']} failed, {tests['errors']} errors, "
            f"{tests['skipped']} skipped ({tests['seconds']:.0f} s)",
            "",
        ]
        lines += [
            f"- {c['outcome']}: `{c['id']}`" + (f": {c['reason']}" if c.get("reason") else "") for c in tests["cases"]
        ]
        lines.append("")
    lines += ["## Figures, each against its baseline from the same run", ""]
    lines += ["| figure | measured | baseline | ratio | command (baseline) |", "| --- | --- | --- | --- | --- |"]
    for f in report["figures"]:
        lines.append(
            f"| {f['name']} | {_number(f['value'])} {f['unit']} | {_number(f['baseline'])} {f['unit']} ({f['baseline_name']}) "
            f"| {_number(f['ratio'], 3)}x | `{f['command']}` (`{f['baseline_command']}`) |"
        )
    lines += ["", "## Steps", ""]
    lines += [f"- {s['name']}: {s['status']}, {s['seconds']:.0f} s: `{s['command']}`" for s in report["steps"]]
    if report["notes"]:
        lines += ["", "## Notes", "", *(f"- {n}" for n in report["notes"])]
    return "\n".join(lines) + "\n"


def _number(value, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:,.{digits}g}" if isinstance(value, float) else str(value)
