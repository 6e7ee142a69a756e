"""``ctx.progress()``: the one-line opt-in of a ``shoal run`` script to the watchdog (issue 22)."""

import subprocess
import sys

SCRIPT = """
import os, shoal
from shoal.progress import read_progress
ctx = shoal.init()
progress = ctx.progress()
assert progress is ctx.progress(), "one writer per process"
progress.phase("forward", 7)
seen = read_progress(os.environ["SHOAL_PROGRESS_DIR"])
print(seen[0].rank, seen[0].phase, seen[0].step)
ctx.shutdown()
print(read_progress(os.environ["SHOAL_PROGRESS_DIR"])[0].phase)
"""


def test_a_script_opts_in_with_one_call_and_shutdown_marks_it_done(tmp_path):
    env = {"SHOAL_PROGRESS_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["0 forward 7", "done"]
    assert (tmp_path / "rank-0.progress").is_file()


def test_without_a_launcher_the_writer_does_nothing(tmp_path):
    script = "import shoal; ctx = shoal.init(); p = ctx.progress(); p.phase('data', 1); print(p.enabled)"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
    assert list(tmp_path.iterdir()) == []
