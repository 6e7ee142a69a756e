"""The rest of Horovod's collective API, every dtype Horovod accepts, and its cross-rank checks, on 1-3 real ranks.

scripts/hvd_collectives.py runs each call on every rank and compares it with the value plain torch
computes from all ranks' inputs. Semantics followed (horovod/horovod, Horovod 0.28.1,
``horovod/torch/mpi_ops.py``): grouped_allreduce / grouped_allgather / grouped_reducescatter /
reducescatter / alltoall_async / sparse_allreduce_async signatures and defaults (reducescatter's op
defaults to Average), the autograd rules of each, and reducescatter's uneven split
(``ReducescatterOp::ComputeOutputShapeForRank``, ``horovod/common/ops/collective_operations.cc``:
the first ``rows % size`` ranks get one more row). The mismatch checks mirror the coordinator's
(``horovod/common/controller.cc``: "Mismatched data types", "Mismatched ... tensor shapes",
"Mismatched reduction operation", root ranks) and the duplicate-name rule (``DUPLICATE_NAME_ERROR``,
``horovod/common/common.h``), which Horovod raises on every rank.
"""

from __future__ import annotations

import pytest
from horovod_launch import COLLECTIVES, check, clean_env, results, run

DTYPES = ["uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64", "bool"]
REDUCIBLE = [d for d in DTYPES if d != "bool"]
PER_DTYPE = ["allgather", "allgather_async", "broadcast", "broadcast_input_unchanged", "broadcast_", "broadcast_async_"]
PER_DTYPE += ["alltoall", "alltoall_counts", "alltoall_async", "grouped_allgather"]
OPS = ["Sum", "Average", "Min", "Max", "Product"]
PER_REDUCIBLE = [f"allreduce/{op}" for op in OPS] + [f"grouped_allreduce/{op}" for op in OPS]
PER_REDUCIBLE += ["allreduce/scaled", "allreduce_", "allreduce_async", "allreduce_async_", "allreduce_async_/in_place"]
PER_REDUCIBLE += ["grouped_allreduce/scaled", "grouped_allreduce_", "grouped_allreduce_/in_place"]
PER_REDUCIBLE += ["grouped_allreduce_async", "grouped_allreduce/inputs_unchanged", "grouped_allreduce_async_"]
PER_REDUCIBLE += ["reducescatter/Sum", "reducescatter/Average", "reducescatter/Max", "reducescatter_async/scaled"]
PER_REDUCIBLE += ["reducescatter/default_average", "grouped_reducescatter", "grouped_reducescatter_async"]
OTHERS = ["grad/grouped_allreduce", "grad/reducescatter", "grad/alltoall", "grad/grouped_allgather"]
OTHERS += ["broadcast_parameters/int16", "sparse_allreduce/sum", "sparse_allreduce/average", "after_errors/allreduce"]
EXPECTED_CHECKS = (
    {f"{c}/{d}" for c in PER_DTYPE for d in DTYPES}
    | {f"{c}/{d}" for c in PER_REDUCIBLE for d in REDUCIBLE}
    | set(OTHERS)
)

MISMATCH = "HorovodMismatchError,ShoalError,HorovodInternalError,RuntimeError,Exception: "

USAGE = "HorovodUsageError,ShoalError,ValueError,Exception: "
ERRORS = {  # the same line on every rank, in Horovod's exception types
    "shape": MISMATCH + "hvd.allreduce 'grad.w': rank 1 has shape [3, 4], rank 0 has [4, 3]",
    "dtype": MISMATCH + "hvd.allreduce: rank 1 has dtype float64, rank 0 float32",
    "name": MISMATCH + "hvd.allreduce 'loss.0': rank 1 named it 'loss.1', rank 0 'loss.0'",
    "op": MISMATCH + "hvd.allreduce: rank 1 has op=Max, rank 0 op=Sum",
    "root": MISMATCH + "hvd.broadcast: rank 1 has root_rank=1, rank 0 root_rank=0",
    "count": MISMATCH + "hvd.grouped_allreduce: rank 1 passed 2 tensors, rank 0 1",
    "gather_dims": MISMATCH + "hvd.grouped_allgather: tensor 1: rank 1 has shape [1, 2], rank 0 has [1, 1]",
    "splits": USAGE + "hvd.alltoall: rank 1: splits=[3, 3] do not divide the tensor's 4 rows among 2 ranks",
    "not_contiguous": USAGE + "hvd.allreduce: rank 1: a tensor is not contiguous",
    "duplicate": USAGE + "hvd.allreduce 'twice': rank 0 submitted it while an earlier op named 'twice' "
    "was still pending (Horovod's DUPLICATE_NAME_ERROR)",
    "duplicate_on_some_ranks": USAGE + "hvd.allreduce 'once': rank 1 submitted it while an earlier op named "
    "'once' was still pending (Horovod's DUPLICATE_NAME_ERROR)",
    **{  # Horovod's *_duplicate_name_error: the first op's handle was dropped, its name is still pending
        f"dropped_{kind}": USAGE + f"hvd.{kind} 'dup.{kind}': rank 0 submitted it while an earlier op named "
        f"'dup.{kind}' was still pending (Horovod's DUPLICATE_NAME_ERROR)"
        for kind in ("allreduce", "allgather", "broadcast", "reducescatter")
    },
}
ALWAYS = {k for k in ERRORS if k == "duplicate" or k.startswith("dropped_")}
"""Raised with one process too: a duplicate name needs no peer."""
JOINED = "rank {first} has called hvd.join(), and "


def _even_split(n: int) -> str:
    """Horovod's test_horovod_alltoall_equal_split_length_error: n + 1 rows and no splits."""
    return USAGE + (
        f"hvd.alltoall: rank 0: splits not given and the tensor's {n + 1} rows do not split evenly among {n} ranks"
    )


def _check_joins(ranks: list[dict], n: int) -> None:
    """Horovod's test_horovod_join_allreduce/_allgather/_broadcast, without a DistributedOptimizer.

    Rank ``first`` joins; the others' allreduces count its zeros (Average divides by n), other
    collectives raise HorovodInternalError on every active rank; join returns the same rank
    everywhere, not ``first`` (ties go to the higher rank).
    """
    for first in range(n):
        last = max(q for q in range(n) if q != first) if n > 1 else 0
        for r, seen in enumerate(ranks):
            joined = seen["joins"][first]
            assert joined["ret"] == last and joined["everyone"] == [last] * n, joined
            if r == first:
                continue
            assert joined["average"] == ["ok", "ok"] and joined["grouped_sum"] == "ok", joined
            prefix = MISMATCH + "hvd.{call}: " + JOINED.format(first=first)
            assert joined["allgather"] == prefix.format(call="allgather") + (
                "only allreduce and barrier go on beside a joined rank (Horovod: 'Allgather is not supported with "
                "Join at this time')"
            )
            assert joined["broadcast"] == prefix.format(call="broadcast") + (
                "only allreduce and barrier go on beside a joined rank (Horovod: 'Broadcast is not supported with "
                "Join at this time')"
            )
            assert joined["max"] == prefix.format(call="allreduce") + (
                "op=Max cannot go on beside a joined rank: its zeros would count as values"
            )


def _check(ranks: list[dict], n: int) -> None:
    for seen in ranks:
        assert set(seen["checks"]) == EXPECTED_CHECKS, set(seen["checks"]) ^ EXPECTED_CHECKS
        failed = {name: outcome for name, outcome in seen["checks"].items() if outcome != "ok"}
        assert not failed, f"rank {seen['rank']}: {failed}"
        if n > 1:  # bad input one rank found in its own arguments is raised on every rank too
            splits = f"splits={[3] * n} do not divide the tensor's {2 * n} rows among {n} ranks"
            expected = {**ERRORS, "splits": USAGE + f"hvd.alltoall: rank 1: {splits}", "even_split": _even_split(n)}
            assert seen["errors"] == expected
        else:  # one process has no peer to disagree with, and 2 rows split over 1; a duplicate name is still refused
            assert seen["errors"] == {k: ERRORS[k] if k in ALWAYS else "no error" for k in [*ERRORS, "even_split"]}
    _check_joins(ranks, n)


def test_one_process_under_plain_python(tmp_path):
    check(run("python", 1, COLLECTIVES, str(tmp_path)))
    _check(results(tmp_path, 1), 1)


@pytest.mark.multiprocess
def test_two_ranks_with_horovod_settings_that_are_ignored(tmp_path):
    """HOROVOD_TIMELINE and HOROVOD_CYCLE_TIME: one warning line for the job (rank 0), then the run goes on."""
    env = clean_env(HOROVOD_TIMELINE=str(tmp_path / "timeline.json"), HOROVOD_CYCLE_TIME="5")
    proc = run("torchrun", 2, COLLECTIVES, str(tmp_path), env=env)
    check(proc)
    _check(results(tmp_path, 2), 2)
    warnings = [line for line in proc.stderr.splitlines() if "shoal: warning:" in line]
    assert len(warnings) == 1, proc.stderr
    assert "shoal.horovod ignores HOROVOD_CYCLE_TIME, HOROVOD_TIMELINE" in warnings[0]
    assert "torch.profiler" in warnings[0]
    assert not (tmp_path / "timeline.json").exists()


@pytest.mark.multiprocess
def test_three_ranks_uneven_splits(tmp_path):
    """3 ranks: reducescatter's 7 rows split 3/2/2, alltoall's splits differ per rank and per peer."""
    check(run("torchrun", 3, COLLECTIVES, str(tmp_path)))
    _check(results(tmp_path, 3), 3)
