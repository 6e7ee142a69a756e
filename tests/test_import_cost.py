"""Imports users wrote before the layers moved keep working (with a DeprecationWarning)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import warnings
warnings.simplefilter("error", DeprecationWarning)
try:
    import shoal.dist
except DeprecationWarning as warning:
    print("warned:", warning)
warnings.simplefilter("ignore", DeprecationWarning)
from shoal.dist.collectives import all_reduce_mean
from shoal.dist.context import init
from shoal.dist import wrap
from shoal.launch.local import launch_local
import shoal
assert init is shoal.init and wrap.unwrap_model is shoal.unwrap_model and all_reduce_mean is shoal.all_reduce_mean
print("ok")
"""


def test_old_import_paths_still_work_and_say_where_to_go():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "warned: shoal.dist is deprecated: use the names in shoal" in proc.stdout
    assert proc.stdout.strip().endswith("ok")


def test_import_shoal_imports_no_torch():
    code = "import sys, shoal; shoal.__version__; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr
