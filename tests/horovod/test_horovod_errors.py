"""Bad input and what shoal.horovod does not offer: one line naming it, a HINT, a non-zero exit, no hang.

The scripts run for real (scripts/hvd_bad_input.py); the one-process failures each in a process of
its own started warm (tests/warm.py: torch already imported; a fresh interpreter a case cost 1.8-2.9
CPU-s), the multi-rank ones as every launcher's fresh ranks. In-process tests cover what needs no
process group (calls before ``hvd.init()`` raise before touching anything).
"""

from __future__ import annotations

import pytest
import torch
from horovod_launch import BAD_INPUT, clean_env, needs_mpirun, run

import shoal.horovod as hvd
from shoal.errors import ShoalError


def _two_lines(stderr: str, message: str, hint: str) -> None:
    """The error as the excepthook prints it: ``shoal: error: <message> (at file:line)`` then ``HINT: ...``."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    at = next(i for i, line in enumerate(lines) if "shoal: error:" in line)
    assert message in lines[at] and "(at hvd_bad_input.py:" in lines[at], stderr
    assert lines[at + 1].split("HINT: ", 1)[1].startswith(hint), stderr
    assert "Traceback" not in stderr


ONE_PROCESS = [
    ("before-init", "hvd.rank() was called before hvd.init()", "call hvd.init() once"),
    ("adasum", "hvd.DistributedOptimizer(op=hvd.Adasum): Adasum is not supported", "use op=hvd.Average"),
    ("elastic", "hvd.elastic.run: Horovod's elastic training is not supported", "restart failed workers"),
    ("timeline", "hvd.start_timeline(): Horovod's timeline is not supported", "profile with torch.profiler"),
    ("missing-name", "hvd.SyncBatchNorm: Horovod's SyncBatchNorm is not supported", "use torch.nn.SyncBatchNorm"),
]


@pytest.mark.parametrize(("case", "message", "hint"), ONE_PROCESS)
def test_one_process_fails_with_one_line_and_a_hint(case, message, hint):
    proc = run("python", 1, BAD_INPUT, case, timeout=120, warm_script=True)
    assert proc.returncode == 1
    _two_lines(proc.stderr, message, hint)
    assert "not reached" not in proc.stdout


def test_horovod_timeline_variable_warns_once_and_the_script_goes_on():
    """Horovod settings shoal ignores no longer stop init(): one warning line names them (issue 19)."""
    proc = run("python", 1, BAD_INPUT, "none", env=clean_env(HOROVOD_TIMELINE="/tmp/timeline.json"), timeout=120)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(warnings) == 1 and warnings[0].startswith("shoal: warning: shoal.horovod ignores HOROVOD_TIMELINE")
    assert "not reached" in proc.stdout


@pytest.mark.multiprocess
def test_tensors_that_differ_across_ranks_fail_on_every_rank_without_a_hang():
    """Rank 1 passes a transposed tensor to hvd.allreduce: both ranks print the same line and exit 1."""
    proc = run("shoal-run", 2, BAD_INPUT, "shape-differs", timeout=180)
    assert proc.returncode != 0
    message = "shoal: error: hvd.allreduce 'grad.w': rank 1 has shape [3, 4], rank 0 has [4, 3]"
    errors = [line for line in proc.stderr.splitlines() if message in line]
    assert {line.split("]: ", 1)[0] for line in errors} == {"[rank0", "[rank1"}, proc.stderr
    assert "HINT: pass a tensor of the same shape on every rank" in proc.stderr
    assert "Traceback" not in proc.stderr and "not reached" not in proc.stdout


@pytest.mark.multiprocess
@pytest.mark.parametrize("launcher", ["shoal-run", pytest.param("mpirun", marks=needs_mpirun)])
def test_parameters_that_differ_across_ranks_fail_on_every_rank(launcher):
    """Rank 1 builds a wider layer: both ranks name the parameter and stop, well within the timeout.
    Under ``shoal run`` (torch's elastic agent, as under torchrun: [rankN] prefixes, the other rank
    stopped once one fails) and under mpirun (no agent: each rank's own stderr)."""
    proc = run(launcher, 2, BAD_INPUT, "model-differs", timeout=180)
    assert proc.returncode != 0
    message = "0.weight is [9, 4] float32 on rank 1 but [8, 4] float32 on rank 0"
    errors = [line for line in proc.stderr.splitlines() if "shoal: error: hvd.DistributedOptimizer" in line]
    if launcher == "mpirun":  # each rank's own stderr, unprefixed
        assert sum(message in line for line in errors) == 2, proc.stderr
    else:  # torch's agent prefixes each rank's lines with [rankN]
        assert {line.split("]: ", 1)[0] for line in errors if message in line} >= {"[rank0", "[rank1"}, proc.stderr
    assert "HINT: build the same model on every rank" in proc.stderr
    assert "not reached" not in proc.stdout


@pytest.mark.parametrize(
    "call",
    [
        hvd.size,
        hvd.rank,
        hvd.local_rank,
        hvd.local_size,
        hvd.cross_rank,
        hvd.cross_size,
        hvd.mpi_threads_supported,
        hvd.barrier,
        hvd.join,
        lambda: hvd.allreduce(torch.ones(1)),
        lambda: hvd.allgather(torch.ones(1)),
        lambda: hvd.grouped_allreduce([torch.ones(1)]),
        lambda: hvd.grouped_allgather([torch.ones(1)]),
        lambda: hvd.reducescatter(torch.ones(2)),
        lambda: hvd.grouped_reducescatter([torch.ones(2)]),
        lambda: hvd.alltoall_async(torch.ones(2)),
        lambda: hvd.sparse_allreduce_async(torch.ones(2).to_sparse(), "emb", hvd.Sum),
        lambda: hvd.broadcast(torch.ones(1), 0),
        lambda: hvd.broadcast_object(1),
        lambda: hvd.broadcast_parameters({}, 0),
        lambda: hvd.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)),
    ],
)
def test_calls_before_init_are_value_errors_with_a_hint(call):
    assert not hvd.is_initialized()
    with pytest.raises(ValueError, match=r"was called before hvd\.init\(\)") as caught:
        call()
    assert isinstance(caught.value, ShoalError) and caught.value.hint.startswith("call hvd.init() once")


def test_unknown_names_are_attribute_errors_naming_them():
    assert not hasattr(hvd, "SyncBatchNorm") and not hasattr(hvd, "no_such_thing")
    with pytest.raises(AttributeError, match="hvd.ProcessSet: process sets is not supported") as caught:
        hvd.ProcessSet  # noqa: B018
    assert "torch.distributed.new_group(ranks)" in caught.value.hint
    with pytest.raises(AttributeError, match="hvd.no_such_thing is not part of shoal.horovod"):
        hvd.no_such_thing  # noqa: B018
    with pytest.raises(NotImplementedError, match="hvd.elastic.TorchState"):
        hvd.elastic.TorchState  # noqa: B018


def test_adasum_and_unknown_ops_are_refused_before_anything_runs():
    with pytest.raises(NotImplementedError, match=r"hvd.allreduce\(op=hvd.Adasum\): Adasum is not supported"):
        hvd.allreduce(torch.ones(1), op=hvd.Adasum)
    with pytest.raises(ValueError, match="op=7 is not a reduction op"):
        hvd.allreduce(torch.ones(1), op=7)
    with pytest.raises(ValueError, match="both op and average were given"):
        hvd.allreduce(torch.ones(1), op=hvd.Sum, average=True)
