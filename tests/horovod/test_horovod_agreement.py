"""The cross-rank check's pure parts: what is compared, and the one line every rank raises.

Rules from Horovod's coordinator (horovod/horovod 0.28.1, ``horovod/common/controller.cc``): ranks
must agree on the operation, dtype, shape (all but the first dimension for allgather and alltoall),
reduction op, scale factors, root rank and CPU/GPU placement. The real multi-rank runs are in
test_horovod_collectives.py; here the descriptions are built in-process, as each rank builds its own.
"""

from __future__ import annotations

import pytest
import torch

from shoal.horovod import agreement, state
from shoal.horovod.errors import HorovodInternalError, HorovodMismatchError
from shoal.horovod.ops import ReduceOp
from shoal.horovod.unsupported import ignored_settings
from shoal.launch.ports import find_free_port


def _sub(call="allreduce", tensors=(torch.zeros(4, 3),), name=None, ragged=False, **settings):
    return agreement.describe(call, list(tensors), name, settings, ragged=ragged)


def test_only_the_first_dimension_may_differ_where_ranks_gather():
    assert (
        _sub(tensors=[torch.zeros(2, 3)], ragged=True).digest()
        == _sub(tensors=[torch.zeros(5, 3)], ragged=True).digest()
    )
    assert _sub(tensors=[torch.zeros(2, 3)]).digest() != _sub(tensors=[torch.zeros(5, 3)]).digest()
    assert (
        _sub(tensors=[torch.zeros(2, 3)], ragged=True).digest() != _sub(tensors=[torch.zeros(2)], ragged=True).digest()
    )


SUM = {"op": ReduceOp.Sum, "prescale_factor": 1.0}


@pytest.mark.parametrize(
    ("rank0", "rank1", "message", "hint"),
    [
        (
            _sub(),
            _sub(call="allgather"),
            "rank 1 called hvd.allgather, rank 0 hvd.allreduce (Horovod: 'Mismatched operations')",
            "every rank must issue",
        ),
        (_sub(name="a"), _sub(name="b"), "rank 1 named it 'b', rank 0 'a'", "every rank must issue"),
        (
            _sub(**SUM),
            _sub(op=ReduceOp.Max, prescale_factor=1.0),
            "rank 1 has op=Max, rank 0 op=Sum",
            "pass the same op",
        ),
        (
            _sub(**SUM),
            _sub(op=ReduceOp.Sum, prescale_factor=2.0),
            "rank 1 has prescale_factor=2.0, rank 0 prescale_factor=1.0",
            "pass the same prescale_factor",
        ),
        (
            _sub(),
            _sub(tensors=[torch.zeros(4, 3, dtype=torch.int16)]),
            "rank 1 has dtype int16, rank 0 float32",
            "cast",
        ),
        (
            _sub(),
            _sub(tensors=[torch.zeros(3, 4)]),
            "rank 1 has shape [3, 4], rank 0 has [4, 3]",
            "pass a tensor of the",
        ),
        (_sub(), _sub(tensors=[torch.zeros(4, 3, device="meta")]), "rank 1 has it on meta, rank 0 on cpu", "put the"),
        (_sub(), _sub(tensors=[torch.zeros(4, 3)] * 2), "rank 1 passed 2 tensors, rank 0 1", "pass the same list"),
    ],
)
def test_every_rank_gets_the_same_line_naming_the_first_difference(rank0, rank1, message, hint):
    error = agreement.explain([rank0, rank1])
    assert isinstance(error, HorovodMismatchError) and isinstance(error, HorovodInternalError)
    assert error.message.split(": ", 1)[1] == message, error.message
    assert error.hint.startswith(hint), error.hint


def test_grouped_calls_name_the_tensor_and_the_first_rank_that_differs():
    rank0 = _sub(call="grouped_allreduce", tensors=[torch.zeros(2), torch.zeros(3)])
    same = _sub(call="grouped_allreduce", tensors=[torch.zeros(2), torch.zeros(3)])
    rank2 = _sub(call="grouped_allreduce", tensors=[torch.zeros(2), torch.zeros(3, dtype=torch.float64)])
    error = agreement.explain([rank0, same, rank2])
    assert error.message == "hvd.grouped_allreduce: tensor 1: rank 2 has dtype float64, rank 0 float32"


def test_bad_input_one_rank_found_is_raised_on_every_rank_naming_that_rank():
    problem = ("splits=[3, 3] do not divide the tensor's 4 rows among 2 ranks", "pass 2 non-negative counts")
    rank1 = agreement.describe("alltoall", [torch.zeros(4)], None, ragged=True, problem=problem)
    rank0 = agreement.describe("alltoall", [torch.zeros(4)], None, ragged=True)
    assert rank0.digest() != rank1.digest()
    error = agreement.explain([rank0, rank1])
    assert isinstance(error, ValueError) and error.hint == "pass 2 non-negative counts"
    assert error.message == "hvd.alltoall: rank 1: splits=[3, 3] do not divide the tensor's 4 rows among 2 ranks"


def test_a_pending_name_is_a_duplicate_until_released(monkeypatch):
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(find_free_port()), "SHOAL_ENV": "local"}.items():
        monkeypatch.setenv(name, value)
    state.init()  # a job of one process: the names pending are the job's
    try:
        holder = type("Holder", (), {})()
        agreement.hold("grad.w", holder)
        assert agreement.is_pending("grad.w") and _sub(name="grad.w").duplicate
        error = agreement.explain([_sub(name="grad.w")])
        assert isinstance(error, ValueError)
        assert "rank 0 submitted it while an earlier op named 'grad.w' was still pending" in error.message
        assert error.hint.startswith("call hvd.synchronize(handle) on the earlier op first")
        agreement.release("grad.w", holder)
        assert not agreement.is_pending("grad.w")
        # A dropped handle's op is still in flight: its name stays taken (Horovod's DUPLICATE_NAME_ERROR)...
        agreement.hold("dropped", type("Holder", (), {})())
        assert agreement.is_pending("dropped")
    finally:
        state.shutdown()
    assert not agreement.is_pending("dropped")  # ...until the job is gone


def test_horovod_settings_shoal_ignores_are_listed_and_the_fusion_threshold_is_not():
    env = {"HOROVOD_TIMELINE": "t.json", "HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_AUTOTUNE": "", "PATH": "/bin"}
    assert ignored_settings(env) == ["HOROVOD_TIMELINE"]
    assert ignored_settings({"HOROVOD_CYCLE_TIME": "5", "HOROVOD_AUTOTUNE": "1"}) == [
        "HOROVOD_AUTOTUNE",
        "HOROVOD_CYCLE_TIME",
    ]
