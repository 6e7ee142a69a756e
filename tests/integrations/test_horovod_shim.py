"""The opt-in for unchanged ``import horovod...`` lines: shoal's modules, never in place of a real Horovod.

Real interpreters with the shim's directory first on PYTHONPATH (as a user opts in). The TF/Keras
forms run end to end in tests/cluster_mpi/test_mpijob_keras.py (the lab's unchanged script in MPIJob
pods).
"""

from __future__ import annotations

import os
import subprocess
import sys

from horovod_launch import clean_env

from shoal.horovod.shim import path as shim_path


def _python(code: str, *pythonpath: str) -> subprocess.CompletedProcess:
    env = clean_env(PYTHONPATH=os.pathsep.join(pythonpath))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_python_m_shoal_horovod_shim_prints_the_directory_to_put_on_pythonpath():
    proc = subprocess.run([sys.executable, "-m", "shoal.horovod.shim"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == shim_path()
    assert os.path.isfile(os.path.join(proc.stdout.strip(), "horovod", "tensorflow", "keras.py"))


def test_an_unchanged_horovod_torch_import_is_shoal_horovod():
    code = (
        "import horovod.torch as hvd, shoal.horovod\n"
        "assert hvd is shoal.horovod\n"
        "hvd.init(); print(hvd.size(), hvd.allreduce(hvd.rank() + __import__('torch').ones(1)).item())"
    )
    proc = _python(code, shim_path())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "1.0"]


def test_a_real_horovod_further_on_the_path_wins(tmp_path):
    real = tmp_path / "site" / "horovod"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("REAL = True\n")
    (real / "torch.py").write_text("WHICH = 'real horovod.torch'\n")
    proc = _python(
        "import horovod.torch, horovod; print(horovod.REAL, horovod.torch.WHICH)", shim_path(), str(real.parent)
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True real horovod.torch"
    assert f"a real Horovod is installed ({real / '__init__.py'}); using it, not shoal's" in proc.stderr
