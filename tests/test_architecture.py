"""The layer contract (pyproject's [tool.importlinter]) holds, imports inside functions included."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_layer_contract_holds():
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint_imports, "import-linter is not installed (pip install -e '.[test]')"
    proc = subprocess.run([lint_imports, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_no_cycle_is_exempted():
    """Every package is free of cycles with no exception listed (the last, spec <-> k8s_spec, went with
    the job layer's own package): a new cycle cannot hide behind an ignore_imports line."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    acyclic = [c for c in contracts if c["type"] == "acyclic_siblings"]
    assert acyclic and all(not c.get("ignore_imports") for c in acyclic)


def test_the_modules_rendered_lines_run_exist():
    """Rendered mpirun and srun lines name modules by string (``python -m ...``): they must be real."""
    import importlib.util

    from shoal.jobs.hosts.render import RANK_STATUS_MODULE
    from shoal.launch.as_torchrun import MODULE as AS_TORCHRUN_MODULE

    for name in (RANK_STATUS_MODULE, AS_TORCHRUN_MODULE):
        assert importlib.util.find_spec(name) is not None, name


def test_the_job_layer_imports_no_torch():
    """``shoal launch`` renders and submits on login nodes and laptops without torch: jobs never imports it."""
    probe = (
        "import sys, pkgutil, importlib, shoal.jobs\n"
        "for m in pkgutil.walk_packages(shoal.jobs.__path__, 'shoal.jobs.'):\n"
        "    importlib.import_module(m.name)\n"
        "print('torch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"
