"""The layer contract (pyproject's [tool.importlinter]) holds, imports inside functions included, and the
docs that map the code name modules that exist."""

from __future__ import annotations

import re
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
    from shoal.jobs.slurm_fault_tolerance import LIGHTHOUSE_MODULE
    from shoal.launch.as_torchrun import MODULE as AS_TORCHRUN_MODULE

    for name in (RANK_STATUS_MODULE, AS_TORCHRUN_MODULE, LIGHTHOUSE_MODULE):
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


def test_only_sharded_checkpoints_import_dcp(tmp_path):
    """torch.distributed.checkpoint imports DTensor and sympy (0.5 CPU-s): a worker that trains and
    checkpoints plain files never imports it; checking a sharded checkpoint does."""
    damaged = tmp_path / "ckpt-e00001-s000000001.dcp"
    damaged.mkdir()
    (damaged / "shoal.json").write_text('{"format": "shoal-sharded", "format_version": 1}')
    (damaged / ".metadata").write_bytes(b"not a pickle")
    probe = (
        "import sys, shoal.train.entry, shoal.checkpoint.manager, shoal.checkpoint.files, shoal.context\n"
        "from shoal.checkpoint.sharded_files import inspect_sharded\n"
        "from shoal.errors import ShoalError\n"
        "print('torch.distributed.checkpoint' in sys.modules)\n"
        "try:\n"
        "    inspect_sharded(sys.argv[1])\n"
        "except ShoalError as err:\n"
        "    print(err)\n"
        "print('torch.distributed.checkpoint' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", probe, str(damaged)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    before, message, after = proc.stdout.splitlines()
    assert (before, after) == ("False", "True") and "unreadable DCP .metadata" in message, proc.stdout


MAPS = ("docs/ARCHITECTURE.md", "docs/LAUNCHERS.md", "docs/KUBERNETES.md")
_PATH = re.compile(r"`((?:[a-z_]+/)+[a-z_]*(?:\.[a-z_]+)?)`")
_RUN_MODULE = re.compile(r"`python -m (shoal(?:\.[a-z_0-9]+)+)")


def _names_in_source(path: str) -> bool:
    """``path`` (``launch/local.py``, ``launch/core``, ``data/``, ``tests/...``, or ``module.attr``
    such as ``jobs/slurm.render_sbatch``) names a file, a folder, or a name a module defines."""
    base = (
        ROOT
        if path.split("/", 1)[0] in ("tests", "docs", "scripts", "examples", "src", "benchmarks")
        else ROOT / "src/shoal"
    )
    if (base / path).exists() or (base / f"{path}.py").exists():
        return True
    module, _, attr = path.rpartition(".")
    for source in (base / f"{module}.py", base / module / "__init__.py"):
        if attr != "py" and source.is_file():
            return re.search(rf"^\s*(def|class) {attr}\b|^{attr}\b", source.read_text(), re.M) is not None
    return any((ROOT / "src/shoal").rglob(path))  # a path given inside its package (`rendezvous/explain.py`)


def test_the_maps_name_modules_that_exist():
    """docs/ARCHITECTURE.md, LAUNCHERS.md and KUBERNETES.md name modules by path and the modules rendered lines
    run (``python -m shoal...``): a module that moves or goes takes its mentions with it."""
    import importlib.util

    missing = []
    for doc in MAPS:
        text = (ROOT / doc).read_text()
        missing += [f"{doc}: {p}" for p in sorted(set(_PATH.findall(text))) if not _names_in_source(p)]
        missing += [f"{doc}: {m}" for m in sorted(set(_RUN_MODULE.findall(text))) if not importlib.util.find_spec(m)]
    assert not missing, missing
