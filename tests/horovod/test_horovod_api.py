"""Every shoal.horovod collective and the DistributedOptimizer's rules, checked on 1, 2 and 3 real ranks.

scripts/hvd_api.py runs the calls on each rank and records what it saw; the expected values here
are Horovod's semantics (``horovod/torch/mpi_ops.py``, ``optimizer.py``, ``functions.py`` of
Horovod 0.28) worked out for rank r of n (rank r holds ``[r + 1, 10 (r + 1)]`` and so on).
"""

from __future__ import annotations

import math

import pytest
import torch
from horovod_launch import API, check, needs_mpirun, results, run


def _check(ranks: list[dict], n: int) -> None:
    total = n * (n + 1) / 2  # sum of r + 1 over the ranks
    for r, seen in enumerate(ranks):
        assert seen["before_init"].startswith("HorovodUsageError,ShoalError,ValueError")
        assert "hvd.rank() was called before hvd.init()" in seen["before_init"]
        assert seen["is_initialized_before"] is False
        assert seen["shape"] == [r, n, r, n, 0, 1, True]
        assert seen["queries"] == {
            "mpi_built": False,
            "mpi_enabled": False,
            "mpi_threads_supported": False,
            "gloo_built": True,
            "gloo_enabled": True,
            "nccl_built": seen["queries"]["nccl_built"],
            "cuda_built": seen["queries"]["cuda_built"],
            "rocm_built": False,
            "ddl_built": False,
            "ccl_built": False,
            "gpu_available": torch.cuda.is_available(),
        }
        reduce = seen["allreduce"]
        assert reduce["average"] == pytest.approx([total / n, 10 * total / n])
        assert reduce["sum"] == pytest.approx([total, 10 * total])
        assert reduce["min"] == [1.0, 10.0] and reduce["max"] == [n, 10.0 * n]
        assert reduce["product"] == pytest.approx([math.factorial(n), math.factorial(n) * 10.0**n])
        assert reduce["int_average"] == [sum(range(2, n + 2)) // n]  # integer average truncates
        assert reduce["scaled"] == pytest.approx([total, 10 * total])  # x2 before, x0.5 after
        assert reduce["average_false"] == reduce["sum"]
        assert reduce["fp16"] == pytest.approx(reduce["average"], rel=1e-3)
        assert reduce["input_unchanged"] == [r + 1.0, 10.0 * (r + 1)]
        assert reduce["inplace"] == [n * (n - 1) / 2] and reduce["async"] == [n - 1.0] and reduce["polled"]
        assert reduce["grad"] == [total]  # d/dx of sum_r (r+1) * allreduce_sum(x): the gradient is reduced too
        assert "Adasum is not supported" in seen["adasum"] and "NotImplementedError" in seen["adasum"]
        assert seen["allgather"] == [[float(q), float(q)] for q in range(n) for _ in range(q + 1)]
        if n > 1:
            # the same line on every rank, a HorovodInternalError as Horovod's synchronize raises
            assert seen["allgather_bad"] == (
                "HorovodMismatchError,ShoalError,HorovodInternalError,RuntimeError,Exception: "
                "hvd.allgather: rank 1 has shape [1, 3], rank 0 has [1, 2]"
            )
        assert seen["allgather_object"] == [{"rank": q} for q in range(n)]
        assert seen["broadcast_object"] == {"from": n - 1}
        assert seen["broadcast"] == [min(1.0, n - 1.0)]
        assert seen["broadcast_"] == [0.0, 0.0]
        assert f"root_rank={n} is not a rank of this job" in seen["broadcast_bad_root"]
        _check_alltoall(ranks, r, n)
        accumulate = seen["accumulate"]
        assert accumulate["pass_1_stayed_local"] and accumulate["reduced_is_average_of_local_sums"]
        # Horovod's test_synchronize_step_warning: exactly one warning, with Horovod's words
        (warning,) = seen["step_after_synchronize_warns"]
        assert warning.startswith("optimizer.step() called without optimizer.skip_synchronize()"), warning
        _check_optimizer_cases(seen, n)
        if n > 1:  # one process registers no hooks and checks nothing, as in Horovod
            assert seen["buckets"] == 2
            assert accumulate["in_flight_after_pass_1"] == 0  # pass 1 of 2: nothing sent
            assert accumulate["in_flight_after_pass_2"] == 2  # both buckets started during backward
            assert "zero_grad() was called after loss.backward()" in accumulate["zero_grad_mid_accumulation"]
            assert "AssertionError" in accumulate["zero_grad_mid_accumulation"]
            assert "more than backward_passes_per_step=2" in seen["too_many_passes"]
        assert seen["same_weights"] == [seen["same_weights"][0]] * n
        assert seen["join_last"] == n - 1
        assert seen["after_join_allreduce"] == n
    if n > 1:  # the last rank's last step ran alone: Average still divides by size
        assert ranks[-1]["alone_step_is_local_over_size"]


def _check_optimizer_cases(seen: dict, n: int) -> None:
    """Horovod's test_optimizer_no_named_parameters, test_broadcast_state_no_grad, test_sparse_embeddings."""
    assert seen["default_names"] == {
        "names": ["allreduce.noname.0.0", "allreduce.noname.0.1", "allreduce.noname.1.0", "allreduce.noname.1.1"],
    }
    # a fresh optimizer: trainable parameters get a zero gradient (as Horovod's state step leaves
    # them), the frozen one none; no step is taken, so the weights and the state stay as they were
    assert seen["fresh_state"] == {
        "frozen_grad": "None",
        "trainable_grad": [0.0] * 4,
        "weights_unmoved": True,
        "state_empty": True,
    }
    # every step's gradients are the average of the ranks' own, the embedding's still sparse
    sparse = seen["sparse"]
    assert sparse["embedding/False"] == sparse["embedding/True"] == {"steps": [[True, True]] * 2, "same_weights": True}
    # then rank r takes r more steps and joins: the last rank's last step is its own rows over n
    alone = {"alone": True} if n > 1 and seen["rank"] == n - 1 else {}
    assert sparse["mixed"] == {"steps": [[True, True]] * 3, "same_weights": True, "join_last": n - 1, **alone}


def _check_alltoall(ranks: list[dict], r: int, n: int) -> None:
    seen = ranks[r]["alltoall"]
    expected_rows, expected_counts = [], []
    for source in range(n):
        splits = ranks[source]["alltoall"]["sent_splits"]
        first = sum(splits[:r])
        expected_rows += [100.0 * source + i for i in range(first, first + splits[r])]
        expected_counts.append(splits[r])
    assert seen["received"] == expected_rows and seen["counts"] == expected_counts
    per = 2  # 2n rows split evenly: 2 to each rank
    assert ranks[r]["alltoall_even"] == [10 * s + per * r + i for s in range(n) for i in range(per)]


def test_one_process_under_plain_python(tmp_path):
    check(run("python", 1, API, str(tmp_path)))
    _check(results(tmp_path, 1), 1)


@pytest.mark.multiprocess
def test_two_ranks_under_torchrun(tmp_path):
    proc = run("torchrun", 2, API, str(tmp_path))
    check(proc)
    _check(results(tmp_path, 2), 2)
    assert "initialized after shutdown: False" in proc.stdout


@pytest.mark.multiprocess
@needs_mpirun
def test_three_ranks_under_mpirun(tmp_path):
    check(run("mpirun", 3, API, str(tmp_path)))
    _check(results(tmp_path, 3), 3)
