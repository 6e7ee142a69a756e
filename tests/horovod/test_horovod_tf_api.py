"""shoal.horovod.tensorflow and .keras on 2 real ranks (gloo): Horovod's semantics, Keras 3 fits, bad input.

scripts/hvd_tf_api.py runs every check on each rank in one launch (TensorFlow + torch cost ~3 CPU-s
to import per process) and records what it saw; the expected values are Horovod 0.28's
(``horovod/tensorflow/mpi_ops.py``, ``__init__.py``, ``_keras/callbacks.py``; its
``test/parallel/test_tensorflow.py`` cases) for rank r of 2 holding ``[r + 1, 10 (r + 1)]``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from horovod_launch import SCRIPTS, clean_env, results, run

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(600)]

TF_API = SCRIPTS / "hvd_tf_api.py"
MISMATCH = "hvd.allgather: rank 1 has shape [1, 3], rank 0 has [1, 2]"


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("tf_api")
    proc = run("torchrun", 2, TF_API, str(out), env=clean_env(TF_CPP_MIN_LOG_LEVEL="2"), timeout=480)
    return proc, results(out, 2)


def test_collectives_eager_in_tf_function_and_in_graph_mode(job):
    _, ranks = job
    for r, seen in enumerate(ranks):
        assert seen["allreduce"] == [[1.5, 15.0]] * 3  # eager, tf.function, TF1 graph + Session
        assert seen["allreduce_sum_scaled"] == [[3.0, 30.0]] * 3  # x2 before the sum, x0.5 after
        assert seen["allreduce_max"] == [[2.0, 20.0]] * 3
        assert seen["allreduce_int"] == [[2]] * 3  # (2 + 3) // 2: integer average truncates
        assert seen["allreduce_fp16"] == [1.5, 15.0]
        assert seen["allgather"] == [[[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]] * 3  # first dimensions differ
        assert seen["broadcast"] == [[2.0, 20.0]] * 3
        assert seen["grouped_allreduce"] == [[3.0, 30.0], [6.0, 60.0]]
        assert seen["grouped_allgather"] == [[[1.0, 10.0], [2.0, 20.0]], [[2.0, 20.0], [4.0, 40.0]]]
        # alltoall: rank q sends row 0 to rank 0, rows 1-2 to rank 1; returns (tensor, received splits)
        assert (
            seen["alltoall"]
            == [
                [[[0.0, 0.0], [1.0, 0.0]], [1, 1]],
                [[[0.0, 1.0], [0.0, 2.0], [1.0, 1.0], [1.0, 2.0]], [2, 2]],
            ][r]
        )
        assert seen["reducescatter"] == [[[3.0], [5.0]], [[7.0]]][r]  # Horovod's split: rank 0 one row more
        # IndexedSlices: values and indices all-gathered, values / size for Average (Horovod's rule)
        assert seen["indexed_slices"] == [[[0.5, 0.5], [1.0, 0.5]], [0, 1]]
        assert seen["keras_allreduce"] == 1.0
        assert seen["broadcast_object"] == {"from": 1} and seen["allgather_object"] == [0, 10]
        assert seen["broadcast_variables"] == [1.0, 1.0]


def test_tf1_graphs_dtypes_named_ops_sparse_groups_sync_bn_and_elastic_state(job):
    _, ranks = job
    for r, seen in enumerate(ranks):
        # six independent allreduces of six dtypes in one Session.run: each rank's own order of
        # independent nodes, yet every one meets its own kind on the other rank
        assert seen["graph_fused"] == [[3, 3, 3]] * 6
        assert seen["graph_uint16"] == [60000, 60001, 60001]  # uint16 travels as int32, exactly
        assert seen["named_ops"] == [r, 2, r, 2]  # rank_op, size_op, local_rank_op, local_size_op
        assert seen["grouped_indexed_slices"] == [[[1.0, 1.0], [2.0, 1.0]], [0, 1], [3.0, 30.0]]
        assert seen["broadcast_inplace"] == [[1.0, 2.0], [1.0, 2.0]]  # the variable itself changed
        assert seen["sync_bn"][0] < 1e-5 and seen["sync_bn"][1] < 1e-5  # = BN on both ranks' rows
        # sync takes rank 0's; restore goes back to the last sync or commit
        assert seen["elastic_state"] == [[[1.0, 2.0], 20], [[1.0, 2.0], 20], [[7.0, 7.0], 22]]


def test_gradients_through_collectives_and_the_distributed_tape(job):
    _, ranks = job
    for r, seen in enumerate(ranks):
        assert seen["allreduce_grad"] == [2.0 * (r + 1)] * 2  # d/dx sum(allreduce_sum((r+1) x)): 2 ranks' ones, x (r+1)
        assert seen["allgather_grad"] == [(r + 1.0)] * 2  # the averaged ones, this rank's rows, x (r+1)
        assert seen["tape"] == [[1.5, 1.5], [1.5, 1.5]]  # eager and tf.function: mean of 1 and 2


def test_the_dlpack_bridge_shares_where_safe_and_copies_where_not(job):
    _, ranks = job
    for seen in ranks:
        assert seen["tf_to_torch_shares"] is True
        assert seen["unaligned_copied"] == [True, sum(range(1, 17))]  # would abort TF as a view: copied
        assert seen["strided_copied"] == [True, sum(range(0, 64, 2))]
        assert seen["aligned_shared"] is True


def test_keras_fit_equals_one_process_on_the_global_batch_and_is_the_same_on_every_rank(job):
    _, ranks = job
    for key in ("fit_digest", "jit_digest", "passes2_digest", "fp16_digest"):
        assert ranks[0][key] == ranks[1][key], key  # bit-identical weights on both ranks
    for seen in ranks:
        assert seen["fit_vs_one_process"] < 1e-5
        assert seen["passes2_vs_one_process"] < 1e-5  # backward_passes_per_step=2: Horovod's summed passes
        assert seen["fit_losses"] == ranks[0]["fit_losses"]  # MetricAverageCallback: one value for all
        assert seen["fit_losses"][-1] < seen["fit_losses"][0]
        assert len(seen["jit_warning"]) == 1  # jit_compile=True turned off with one warning, fit ran


def test_learning_rate_warmup_and_schedule_callbacks(job):
    _, ranks = job
    # warm-up over 2 epochs of 4 batches from 0.2 / 2 to 0.2, per batch; then x0.5 from epoch 2
    expected = [0.2 / 2 * (1 + (e + b / 4) / 2) for e in range(2) for b in range(4)] + [0.1] * 4
    for seen in ranks:
        assert seen["lr"] == pytest.approx(expected, rel=1e-6)


def test_errors_are_one_line_and_the_same_on_every_rank(job):
    proc, ranks = job
    for seen in ranks:
        # Horovod's TF class (tf.errors.FailedPreconditionError), and shoal's types and line
        kinds, message = seen["mismatch_eager"].split(": ", 1)
        assert {"FailedPreconditionError", "HorovodInternalError", "ShoalError"} <= set(kinds.split(","))
        assert message == "hvd.allreduce 'grad.w': rank 1 has shape [3], rank 0 has [2]"
        assert seen["graph_mismatch"].startswith("FailedPreconditionError")  # from a TF1 Session too
        assert "hvd.allreduce 'grad.w': rank 1 has shape [3], rank 0 has [2]" in seen["graph_mismatch"]
        assert "InvalidArgumentError" in seen["splits_error"] and "ValueError" in seen["splits_error"]
        assert (
            "NotImplementedError" in seen["indexed_slices_max"] and "only Sum and Average" in seen["indexed_slices_max"]
        )
        assert "NotImplementedError" in seen["indexed_slices_scaled"]
        assert seen["mismatch_dtype"].endswith("hvd.allreduce: rank 1 has dtype float64, rank 0 float32")
        assert seen["mismatch_traced"].startswith("UnknownError")  # tf.py_function's type, message kept below
        assert "process sets are not supported" in seen["process_set"]
        assert "NotImplementedError" in seen["elastic"] and "hvd.elastic.run" in seen["elastic"]
        assert "Adasum is not supported" in seen["adasum"]
        assert seen["not_keras"].startswith("HorovodUsageError") and "not a Keras 3 optimizer" in seen["not_keras"]
        assert seen["eager_global_variables"].startswith("RuntimeError")  # Horovod's own message in TF2
        assert "root_rank=2 is not a rank of this job" in seen["bad_root"]
        assert (
            seen["missing_name"].startswith("HorovodMissingName")
            and "hvd.PartialDistributedGradientTape is not part of" in seen["missing_name"]
        )
        assert seen["keras_alias"] is True  # horovod.keras: the same API as horovod.tensorflow.keras
        assert seen["after_errors"] == [2.0]  # the job goes on after each error
    # The script's last call is the same mismatch inside tf.function, uncaught: each rank ends with
    # shoal's one line (its message, not TF's) and HINT, no traceback.
    assert proc.returncode != 0
    assert proc.stderr.count(f"shoal: error: {MISMATCH}") == 2, proc.stderr[-3000:]
    assert proc.stderr.count("HINT: the shapes may differ only in the first dimension") == 2
    assert "UnknownError" not in proc.stderr and "[rank0]: Traceback" not in proc.stderr


def test_without_tensorflow_the_import_is_one_line_and_a_hint():
    # A real interpreter where `import tensorflow` fails (sys.modules[name] = None is how Python
    # marks a module as absent).
    code = "import sys; sys.modules['tensorflow'] = None; import shoal.horovod.tensorflow.keras"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=clean_env())
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2, proc.stderr
    assert lines[0].startswith("shoal: error: shoal.horovod.tensorflow needs TensorFlow, which is not installed here")
    assert lines[1] == "HINT: pip install 'shoal[tensorflow]'"
