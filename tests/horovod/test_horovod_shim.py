"""The opt-in for unchanged ``import horovod...`` lines: shoal's modules, never in place of a real Horovod.

Real interpreters with the shim's directory first on PYTHONPATH (as a user opts in), and real
launchers with ``--horovod-shim`` (``SHOAL_HOROVOD_SHIM=1``: the shim resolved where each worker
runs); without it, a worker's missing ``horovod`` is one line and a HINT that names shoal's way. The
TF/Keras forms run end to end in tests/cluster_mpi/test_mpijob_keras.py (the lab's unchanged script
in MPIJob pods, from what ``shoal launch k8s --horovod-shim`` renders).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from horovod_launch import clean_env, needs_mpirun

import warm
from shoal.horovod.shim import path as shim_path
from shoal.launch.exit_hook import HOROVOD_SHIM_DIRECTORY
from shoal.launch.ports import find_free_port


def _python(code: str, *pythonpath: str) -> subprocess.CompletedProcess:
    env = clean_env(PYTHONPATH=os.pathsep.join(pythonpath))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_python_m_shoal_horovod_shim_prints_the_directory_to_put_on_pythonpath():
    proc = subprocess.run([sys.executable, "-m", "shoal.horovod.shim"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == shim_path() + "\n"  # one line, for $(...) and a terminal
    assert shim_path() == HOROVOD_SHIM_DIRECTORY  # the directory launch puts on a worker's path (--horovod-shim)
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


LAB = """\
import os, torch
import horovod.torch as hvd
hvd.init()
total = hvd.allreduce(torch.ones(1) * (hvd.rank() + 1), op=hvd.Sum).item()
first = os.environ["PYTHONPATH"].split(os.pathsep)[0]
line = f"rank {hvd.rank()} of {hvd.size()}: {hvd.__name__}, sum {total:g}, shim first {first == SHIM}"
os.write(1, (line + "\\n").encode())  # one write: the two ranks share the launcher's stdout
"""


def _lab(tmp_path, shim: str = shim_path()) -> str:
    script = tmp_path / "lab.py"
    script.write_text(f"SHIM = {shim!r}\n" + LAB)
    return str(script)


def _ranks(stdout: str) -> list[str]:
    return sorted(line for line in stdout.splitlines() if line.startswith("rank "))


HOROVOD_HINT = (
    "HINT: Horovod itself no longer builds against today's frameworks; shoal serves its API: keep the import "
    "and pass --horovod-shim (or export PYTHONPATH=$(python -m shoal.horovod.shim)), or import "
    "shoal.horovod (torch) or shoal.horovod.tensorflow.keras instead (docs/HOROVOD.md)"
)


def test_a_missing_horovod_names_shoals_way_not_an_install(tmp_path):
    """Issue 49: the Tanzu lab's import under ``shoal run`` without the shim: one line, and a HINT
    that names the shim and shoal's modules (Horovod itself no longer builds)."""
    script = tmp_path / "lab.py"
    script.write_text("import horovod.tensorflow.keras as hvd\nhvd.init()\n")
    proc = warm.run(
        [sys.executable, "-m", "shoal", "run", "--nproc", "2", str(script)],
        env=clean_env(), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("shoal run: 2 workers on this node"), proc.stderr
    failed = f"failed at {script}, line 1: ModuleNotFoundError: No module named 'horovod'"
    # Both ranks fail at once, or one first and shoal stops the other: either way one cause, one HINT.
    assert lines[1:] in (
        [f"shoal: error: ranks 0, 1 {failed}", HOROVOD_HINT],
        [f"shoal: error: rank 0 {failed}", "shoal: rank 1 stopped because rank 0 failed", HOROVOD_HINT],
        [f"shoal: error: rank 1 {failed}", "shoal: rank 0 stopped because rank 1 failed", HOROVOD_HINT],
    ), proc.stderr


@pytest.mark.parametrize("how", ["--horovod-shim", "SHOAL_HOROVOD_SHIM=1"])
def test_shoal_run_gives_every_worker_the_shim_of_its_own_shoal(tmp_path, how):
    """No path given by anyone: each worker's shoal puts its own shim first on the script's path."""
    flag = [how] if how.startswith("--") else []
    env = clean_env(**({} if flag else {"SHOAL_HOROVOD_SHIM": "1"}))
    env.pop("PYTHONPATH", None)
    proc = warm.run(
        [sys.executable, "-m", "shoal", "run", "--nproc", "2", *flag, _lab(tmp_path)],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert _ranks(proc.stdout) == [
        "rank 0 of 2: shoal.horovod, sum 3, shim first True",
        "rank 1 of 2: shoal.horovod, sum 3, shim first True",
    ]


@needs_mpirun
def test_a_hand_typed_mpirun_line_names_the_variable_and_puts_the_shim_in_front(tmp_path):
    """docs/HOROVOD.md's line (as root, with --allow-run-as-root): each rank's as_torchrun resolves the shim."""
    env = clean_env()
    env.pop("PYTHONPATH", None)
    argv = [
        "mpirun", "-np", "2", "--allow-run-as-root", "--oversubscribe", "-x", "SHOAL_HOROVOD_SHIM=1",
        "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={find_free_port()}", "-x", "PATH",
        "python", "-m", "shoal.launch.as_torchrun", "--", "python", _lab(tmp_path),
    ]  # fmt: skip
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert _ranks(proc.stdout) == [
        "rank 0 of 2: shoal.horovod, sum 3, shim first True",
        "rank 1 of 2: shoal.horovod, sum 3, shim first True",
    ]


def test_a_bad_shoal_horovod_shim_is_one_line_before_any_worker(tmp_path):
    env = clean_env(SHOAL_HOROVOD_SHIM="maybe")
    proc = warm.run(
        [sys.executable, "-m", "shoal", "run", "--nproc", "2", _lab(tmp_path)],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode != 0
    assert proc.stderr.splitlines() == [
        "shoal: error: SHOAL_HOROVOD_SHIM=maybe: neither on nor off",
        "HINT: set SHOAL_HOROVOD_SHIM=1 (or pass --horovod-shim) for Horovod's module names; 0 or unset for none",
    ]


def _launch(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return warm.run(
        [sys.executable, "-m", "shoal", "launch", *argv], env=env or clean_env(), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize(
    "form, expected",
    [
        (["k8s", "--kind", "mpijob", "--image", "IMG", "--nnodes", "2"], r"- SHOAL_HOROVOD_SHIM\n"),  # mpirun's -x
        (
            ["k8s", "--kind", "pytorchjob", "--image", "IMG", "--nnodes", "2"],
            r"- name: SHOAL_HOROVOD_SHIM\n +value: '1'",
        ),
        (["k8s", "--kind", "trainjob", "--image", "IMG", "--nnodes", "2"], r"- name: SHOAL_HOROVOD_SHIM\n +value: '1'"),
        (["runai", "--image", "IMG", "--cli", "training"], "SHOAL_HOROVOD_SHIM=1"),
        (["slurm", "--nnodes", "2"], "SHOAL_HOROVOD_SHIM=1"),
        (["--hosts", "10.255.0.1:1,10.255.0.2:1", "--via", "mpirun"], "-x SHOAL_HOROVOD_SHIM=1"),
        (["--hosts", "10.255.0.1:1,10.255.0.2:1", "--via", "ssh"], " SHOAL_HOROVOD_SHIM=1 "),
        (["image", "--mpi"], "ENV SHOAL_HOROVOD_SHIM=1"),
    ],
    ids=lambda v: v[0] + (v[2] if v[0] == "k8s" else v[-1] if v[0] == "--hosts" else "") if isinstance(v, list) else "",
)
def test_every_render_carries_the_variable_and_no_path_of_this_machine(tmp_path, form, expected):
    (tmp_path / "lab.py").write_text("import horovod.tensorflow.keras as hvd\n")
    env = clean_env()
    env.pop("PYTHONPATH", None)
    proc = warm.run(
        [sys.executable, "-m", "shoal", "launch", *form, "--horovod-shim", "--dry-run", "--", "python", "lab.py"],
        env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert re.search(expected if expected.startswith("- ") else re.escape(expected), proc.stdout), proc.stdout
    assert "PYTHONPATH" not in proc.stdout and os.path.join("horovod", "shim") not in proc.stdout, proc.stdout


def test_a_path_of_this_machine_handed_to_pods_is_a_warning(tmp_path):
    """Issue 49: ``--env PYTHONPATH`` holding the shim's path here renders that path into every pod,
    where it does not exist: one warning line names the variable, the path and --horovod-shim."""
    (tmp_path / "lab.py").write_text("import horovod.tensorflow.keras as hvd\n")
    env = clean_env(PYTHONPATH=shim_path())
    proc = warm.run(
        [sys.executable, "-m", "shoal", "launch", "k8s", "--kind", "mpijob", "--image", "IMG", "--nnodes", "2",
         "--env", "PYTHONPATH", "--dry-run", "--", "python", "lab.py"],
        env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        f"shoal launch: warning: --env PYTHONPATH passes this machine's {os.path.realpath(shim_path())} to the "
        "pods, where it exists only if the files there match this machine's; pass --horovod-shim instead: it "
        "finds the shim where each process runs"
    ]
    # A path of no installation here (a claim's mount in the pods) is the user's to give: no warning.
    proc = _launch(
        "k8s", "--image", "IMG", "--env", "DATA=/mnt/shared/data", "--dry-run", "--", "python", str(tmp_path / "lab.py")
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_the_shims_path_passed_on_to_other_hosts_is_a_warning_and_none_for_this_one(tmp_path):
    """``shoal launch --hosts`` passes PYTHONPATH on from this shell unasked: the shim's path of this
    machine reaching other hosts is said (naming --horovod-shim); a host list of this machine alone is not."""
    (tmp_path / "lab.py").write_text("import horovod.tensorflow.keras as hvd\n")
    env = clean_env(PYTHONPATH=shim_path())
    argv = [sys.executable, "-m", "shoal", "launch", "--via", "ssh", "--dry-run", "--", "lab.py"]
    proc = warm.run([*argv[:4], "--hosts", "10.255.0.1:1,10.255.0.2:1", *argv[4:]], env=env, cwd=tmp_path,
                    capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        f"shoal launch: warning: PYTHONPATH (passed on from this shell) passes this machine's "
        f"{os.path.realpath(shim_path())} to the other hosts, where it exists only if the files there match this "
        "machine's; pass --horovod-shim instead: it finds the shim where each process runs"
    ]
    proc = warm.run([*argv[:4], "--hosts", "127.0.0.1:2", *argv[4:]], env=env, cwd=tmp_path,
                    capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
