"""The processes the suite starts keep their temporary files in pytest's directory for the session
(tests/conftest.py sets TMPDIR before xdist starts its workers), so what killed launchers leave is
removed with pytest's own rotation, not left in /tmp."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path


def test_the_tests_and_the_processes_they_start_use_the_sessions_temporary_directory(tmp_path_factory):
    session = tmp_path_factory.getbasetemp()
    session = session.parent if session.name.startswith("popen-gw") else session  # an xdist worker's
    expected = session / "tmp"
    assert os.environ["TMPDIR"] == str(expected) and expected.is_dir()
    assert Path(tempfile.gettempdir()) == expected
    child = subprocess.run(
        [sys.executable, "-c", "import tempfile; print(tempfile.mkdtemp(prefix='shoal-run-'))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    made = Path(child.stdout.strip())
    assert made.parent == expected and made.is_dir()
