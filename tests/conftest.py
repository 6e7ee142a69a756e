"""Shared fixtures: a guard against leaked environment variables, paths, and a CLI runner."""

from __future__ import annotations

import collections
import json
import os
import sys
import tempfile
from pathlib import Path

# Three test files run at a time on 2 cores, each starting processes with OpenMP threads of their own,
# and libgomp spins ~300,000 times in a barrier before it sleeps (it sees its own threads, not the
# other processes'): there the spinning takes the CPU the others wait for (docs/contributing/TEST_TIME.md: a
# 2-thread worker 4.8-9.0 CPU-s by default, 3.9-4.3 passive). PASSIVE sleeps at once. Read when
# libgomp loads (when torch is first imported), so set first; every process the tests start inherits it.
# A value of the caller's wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest

import warm

# One definition of the session's Slurm cluster (real slurmctld, slurmd and munge, started on first
# use): a fixture imported by several test modules would be several fixtures, and two clusters.
from cluster_slurm.slurm_cluster import slurm  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
MNIST_GZ = SHARED / "data" / "mnist"


WARM_SERVERS = pytest.StashKey[str]()
"""The controller's: the directory where its xdist workers share their warm servers (tests/warm.py)."""


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist's controller, for each worker it starts: one directory for all their warm servers, so a
    server one worker started serves the others (each copy costs ~3 CPU-s of its own)."""
    if WARM_SERVERS not in node.config.stash:
        node.config.stash[WARM_SERVERS] = tempfile.mkdtemp(prefix="shoal-warm-")
    node.workerinput["warm_servers"] = node.config.stash[WARM_SERVERS]


@pytest.hookimpl(trylast=True)  # after pytest's own, which makes the session's temporary directory
def pytest_configure(config):
    if "warm_servers" in getattr(config, "workerinput", {}):
        warm.share_servers(config.workerinput["warm_servers"])
    elif not hasattr(config, "workerinput"):
        _temporary_files_in_the_sessions_directory(config)


def _temporary_files_in_the_sessions_directory(config) -> None:
    """TMPDIR, for every process the session starts (its xdist workers first), is a directory in
    pytest's own for the session (``/tmp/pytest-of-USER/pytest-N/tmp``; pytest keeps the last three).
    What the tests' processes leave by design or by being killed (a hang report's ``shoal-run-*``,
    a SIGKILLed launcher's ``shoal-workers-*`` and torch's ``torchelastic_*``, W&B's and
    multiprocessing's) is gone with it, not piled up in /tmp, run after run. The simulated pods'
    processes keep the image's environment (tests/k8s/pod_runtime.py), and /tmp with it."""
    directory = config._tmp_path_factory.getbasetemp() / "tmp"
    directory.mkdir(exist_ok=True)
    os.environ["TMPDIR"] = str(directory)
    tempfile.tempdir = None  # read TMPDIR again


def pytest_unconfigure(config):
    """The controller, once its workers have ended: their servers have ended with them (the last lease
    gone); one that has not is ended here, by its PID."""
    if WARM_SERVERS in config.stash:
        warm.stop_shared_servers(config.stash[WARM_SERVERS])


UNDER_CI = os.environ.get("CI") == "true"
"""CI sets CI=true: there a skip is a failure (but for GPU-marked tests on a machine without CUDA)."""


COST_S = {"slow": 30.0, "multiprocess": 8.0}
"""A rough guess of a test's seconds from its markers (else 0.3 s), for a file that
:data:`FILE_SECONDS` does not list."""
FILE_SECONDS = Path(__file__).with_name("file_seconds.json")
"""Each test file's seconds in a full run, the sum of its tests' times in ``--junitxml=FILE``
(CONTRIBUTING.md says how to refresh it after adding or slowing down a file). Stale figures only
order the files less well."""


SHARED_SESSION_FIXTURES = {"slurm": "slurm", "mlflow_server": "mlflow"}
"""Session fixtures worth making once per run, not once per xdist worker, and the group of the files
that use them: the Slurm cluster (tests/cluster_slurm/slurm_cluster.py: daemons and a fresh state),
the MLflow server (tests/tracking/conftest.py: 7 CPU-s and 6 s before it answers)."""


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group marks set here
def pytest_collection_modifyitems(items):
    """GPU-marked tests skip without CUDA (one rule for all of them). Under pytest-xdist (``-n 3 --dist loadgroup``), a test file runs on one worker,
    so its module fixtures (reference runs, servers) are made once; every test that uses a costly
    session fixture (:data:`SHARED_SESSION_FIXTURES`) runs on one worker too, so the session makes it
    once, not once per worker (and so do the other tests of its file: test_horovod_launchers' torchrun
    reference is made once, not twice).

    The groups are then ordered by their cost, longest first (each group's tests kept together and in
    their order): the files' seconds measured in a full run (:data:`FILE_SECONDS`; a selection of a
    file's tests gets its share), else a guess from the markers. The scheduler
    (``--no-loadscope-reorder``, see the Makefile) hands them out in this order, so the last ones are
    files of quick unit tests that fill the gaps, not a two-minute multi-node file that one worker runs
    alone at the end (xdist's own order, fewest tests last, did that; the markers' guess put a file
    that waits 18 s on timeouts, tests/tracking/test_wandb_network.py, last).

    Runs before xdist's own hook (``tryfirst``), and tags each node id with its group itself: since
    pytest 9.2 an item's node id is built from its structured ``_id``, so xdist's ``item._nodeid =
    ...@group`` no longer reaches its scheduler (pytest-dev/pytest-xdist#1386, fix pending in #1388)
    and every test was its own group: a file's module fixtures were made on both workers, each worker
    started its own Slurm cluster, and a file's tests ran side by side.
    """
    import torch

    no_cuda = pytest.mark.skip(reason="needs CUDA (marked gpu)")
    groups: dict[str, list[pytest.Item]] = {}
    cost: dict[str, float] = {}
    measured = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.is_file() else {}
    path_of = {item: item.nodeid.split("::", 1)[0] for item in items}
    counts = collections.Counter(path_of.values())
    shared = {}  # test file -> the group of the first costly session fixture one of its tests uses
    for item, path in path_of.items():
        for fixture, name in SHARED_SESSION_FIXTURES.items():
            if fixture in item.fixturenames:
                shared.setdefault(path, name)
    for item, path in path_of.items():
        if item.get_closest_marker("gpu") and not torch.cuda.is_available():  # the mark, not a tests/gpu/ name
            item.add_marker(no_cuda)
        group = shared.get(path, path)
        item.add_marker(pytest.mark.xdist_group(group))
        if getattr(item.config.option, "loadgroup", False) and hasattr(item, "_id"):
            from _pytest.nodeid import NodeId  # pytest >= 9.2 (before it, xdist's own suffix works)

            item._id = NodeId.parse(f"{item.nodeid}@{group}")  # what xdist's loadgroup scheduler reads
        groups.setdefault(group, []).append(item)
        marks = [COST_S[m] for m in COST_S if item.get_closest_marker(m)]
        guess = max(marks, default=0.3) if path not in measured else measured[path] / counts[path]
        cost[group] = cost.get(group, 0.0) + guess
    items[:] = [item for group in sorted(groups, key=lambda g: -cost[g]) for item in groups[group]]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI a skipped test fails, unless it is GPU-marked: a green run must prove what it claims,
    not hide a missing mpirun, sshd, Slurm daemon, namespace or dataset behind a skip. Expected
    failures (xfail) stay what they are."""
    outcome = yield
    report = outcome.get_result()
    if not UNDER_CI or not report.skipped or hasattr(report, "wasxfail") or item.get_closest_marker("gpu"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"skipped under CI=true: {reason}\nHINT: install what the test needs in CI (scripts/install-system-deps.sh) or mark it gpu if it needs CUDA"


def session_environ() -> dict[str, str]:
    """os.environ without pytest's bookkeeping of the running test."""
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)  # pytest's own bookkeeping
    return env


@pytest.fixture(scope="session", autouse=True)
def _imports_that_set_env():
    """joblib and torchvision set variables in os.environ when first imported (KMP_INIT_AT_FORK:
    joblib, which flytekit and scikit-learn import; TORCHINDUCTOR_CACHE_DIR: torchvision): imported
    once, before the first test, so the leak guard below only reports what the code under test
    changes, whichever test imports them first (it depends on how xdist hands out the files). A
    fixture, not an import of this module: xdist's controller, which runs no test, then imports
    neither (nor torch: 4 s before it starts the workers). The warm servers start with the
    environment as these imports leave it (else every command would differ from it, and each
    worker's first would start fresh)."""
    import joblib  # noqa: F401
    import torchvision  # noqa: F401

    warm.set_base_environment(os.environ)


@pytest.fixture(autouse=True)
def _no_env_leaks(_imports_that_set_env):
    """Fail any test that leaves os.environ changed (and restore it so others are unaffected)."""
    before = session_environ()
    yield
    after = session_environ()
    if after != before:
        added = sorted(set(after) - set(before))
        removed = sorted(set(before) - set(after))
        changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
        for key in added:
            del os.environ[key]
        os.environ.update(before)
        pytest.fail(f"test leaked environment changes: added={added} removed={removed} changed={changed}")


def shoal_cmd(*args: str) -> list[str]:
    """The command line that runs the installed ``shoal`` with this interpreter."""
    return [sys.executable, "-m", "shoal", *args]


def run_shoal(*args: str, timeout: float = 180, env: dict | None = None, cwd: str | Path | None = None):
    """Run ``shoal ARGS`` in a subprocess; return the CompletedProcess (text, both streams captured).

    Started warm (tests/warm.py: a fork of a process that has imported torch and shoal) unless the
    environment asks for a fresh interpreter."""
    full_env = dict(os.environ)
    full_env.pop("SHOAL_ENV", None)
    if env:
        full_env.update(env)
    return warm.run(shoal_cmd(*args), capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd)


@pytest.fixture
def shoal():
    return run_shoal


@pytest.fixture(scope="session")
def mnist_root(tmp_path_factory) -> Path:
    """Real MNIST decompressed in the layout torchvision expects (``root/MNIST/raw/...``)."""
    import gzip
    import shutil

    if not MNIST_GZ.is_dir():
        pytest.skip(f"real MNIST not found at {MNIST_GZ}")
    root = tmp_path_factory.mktemp("mnist")
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for gz in MNIST_GZ.glob("*-ubyte.gz"):
        with gzip.open(gz, "rb") as src, open(raw / gz.name[:-3], "wb") as dst:
            shutil.copyfileobj(src, dst)
    return root
