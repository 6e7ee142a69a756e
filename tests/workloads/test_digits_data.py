"""The digits workload reads scikit-learn's bundled digits itself and splits them reproducibly."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import torch

from shoal.train.config import TrainConfig
from shoal.workloads import get_workload
from shoal.workloads.digits import TEST_SIZE, load_digits_arrays, stratified_split


def test_same_arrays_as_scikit_learn():
    # In a child: importing scikit-learn sets environment variables (the suite checks for leaks).
    code = (
        "import numpy as np; from sklearn.datasets import load_digits; "
        "from shoal.workloads.digits import load_digits_arrays; "
        "x, y = load_digits(return_X_y=True); ox, oy = load_digits_arrays(); "
        "print(np.array_equal(x, ox), np.array_equal(y, oy), ox.dtype, oy.dtype)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "float64", "int64"]


def test_loading_does_not_import_scikit_learn():
    code = (
        "import sys; from shoal.workloads.digits import load_digits_arrays; load_digits_arrays(); "
        "print(sorted(m for m in ('sklearn', 'scipy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_split_is_a_stratified_partition():
    labels = load_digits_arrays()[1]
    train, test = stratified_split(labels, TEST_SIZE, seed=0)
    assert len(test) == TEST_SIZE and len(train) == len(labels) - TEST_SIZE
    assert np.array_equal(np.sort(np.concatenate([train, test])), np.arange(len(labels)))
    share = np.bincount(labels) * TEST_SIZE / len(labels)  # each class's exact share of the test set
    assert np.all(np.abs(np.bincount(labels[test], minlength=10) - share) < 1)
    again = stratified_split(labels, TEST_SIZE, seed=0)
    assert np.array_equal(again[1], test)
    assert not np.array_equal(stratified_split(labels, TEST_SIZE, seed=1)[1], test)


def test_workload_tensors():
    data = get_workload("digits").load(TrainConfig(workload="digits"), torch.device("cpu"))
    (x, y), (xt, _) = data.train, data.test
    assert x.shape == (1440, 64) and xt.shape == (TEST_SIZE, 64) and y.dtype == torch.long
    assert abs(x.mean().item()) < 1e-5 and abs(x.std().item() - 1) < 1e-4  # standardised on the train set


def test_without_scikit_learn_a_clear_error():
    # A Python that cannot see scikit-learn: its directory is taken off sys.path before the load.
    code = (
        "import importlib.util, os, sys\n"
        "from shoal.errors import ShoalError\n"
        "from shoal.workloads.digits import load_digits_arrays\n"
        "where = os.path.dirname(os.path.dirname(importlib.util.find_spec('sklearn').origin))\n"
        "sys.path[:] = [p for p in sys.path if os.path.abspath(p) != where]\n"
        "importlib.invalidate_caches()\n"
        "try:\n"
        "    load_digits_arrays()\n"
        "except ShoalError as err:\n"
        "    print(err.format())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "shoal: error: the digits workload needs scikit-learn, which is not installed",
        "HINT: pip install scikit-learn (it ships the 1,797 digit images), or choose another workload",
    ]
