"""``import shoal`` stays cheap: the public names load on first use."""

from __future__ import annotations

import subprocess
import sys


def test_import_shoal_imports_no_torch():
    code = "import sys, shoal; shoal.__version__; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr
