"""``--fault-tolerance``'s bad input: one line and a HINT, before any replica group starts."""

from __future__ import annotations

import sys
import time

import pytest
import torch

from conftest import run_shoal
from shoal.errors import ShoalError
from shoal.launch.ports import find_free_port
from shoal.train.config import TrainConfig


def _refused(*args: str, timeout: float = 60):
    done = run_shoal("train", "digits", "--fault-tolerance", *args, timeout=timeout)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-2].startswith("shoal: error: ") and lines[-1].startswith("HINT: "), done.stderr
    return lines


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (("--nproc", "2", "--comm-hook", "bf16"), "--comm-hook does not work with --fault-tolerance"),
        # --strategy fsdp: one group per node by default (FSDP over the node's processes): one node is one group
        (("--nproc", "2", "--strategy", "fsdp"), "one replica group (--nproc 2 in groups of 2) has nobody to fail"),
        (("--nproc", "4", "--nproc-per-group", "3"), "--nproc-per-group 3 does not divide this node's --nproc 4"),
        (("--nproc", "2", "--grad-accum", "2"), "--grad-accum does not work with --fault-tolerance"),
        (
            ("--nproc", "2", "--device", "cpu", "--backend", "nccl"),
            "the nccl backend needs CUDA devices, but this process runs",
        ),
        (("--nproc", "1"), "one replica group has nobody to fail over to"),
        (("--nproc", "2", "--checkpoint-every", "50steps"), "--checkpoint-every Nsteps does not work with"),
        (
            ("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29400"),
            "across nodes needs --master-addr",
        ),
    ],
)
def test_refused_before_any_group_starts(flags, said, tmp_path):
    lines = _refused(*flags, "--out", str(tmp_path / "run"))
    assert said in lines[-2]
    assert not (tmp_path / "run" / "replicas.jsonl").exists()  # no group ever started


def test_several_nodes_need_a_shared_out():
    lines = _refused("--nnodes", "2", "--master-addr", "127.0.0.1")
    assert "across nodes needs --out" in lines[-2]


def test_lighthouse_or_group_size_without_fault_tolerance_is_refused():
    with pytest.raises(ShoalError, match="--lighthouse is for --fault-tolerance"):
        TrainConfig(lighthouse="http://127.0.0.1:29510")
    with pytest.raises(ShoalError, match="--nproc-per-group is for --fault-tolerance"):
        TrainConfig(nproc_per_group=2)


def test_torchft_missing_says_how_to_install(monkeypatch):
    """``sys.modules[name] = None`` is how Python marks a module as not importable."""
    monkeypatch.setitem(sys.modules, "torchft", None)
    with pytest.raises(ShoalError) as err:
        TrainConfig(fault_tolerance=True)
    assert "needs torchft" in err.value.message and "pip install 'shoal[ft]'" in err.value.hint
    from shoal.distributed.fault_tolerance import require_torchft

    with pytest.raises(ShoalError, match="needs torchft"):
        require_torchft()


@pytest.mark.multiprocess
@pytest.mark.slow
def test_an_unreachable_lighthouse_is_named_within_a_minute(tmp_path):
    endpoint = f"http://127.0.0.1:{find_free_port()}"  # nothing listens there
    started = time.monotonic()
    lines = _refused("--nproc", "2", "--lighthouse", endpoint, "--out", str(tmp_path / "run"), timeout=150)
    took = time.monotonic() - started
    assert f"cannot reach torchft's lighthouse at {endpoint}" in lines[-2], lines
    assert took < 90, took  # 30 s of connect timeout after the groups' start-up


def _train_nothing():
    return None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_cuda_without_a_gpu_is_refused_before_any_group_starts():
    import shoal

    with pytest.raises(ShoalError, match="--device cuda was asked for but CUDA is not available"):
        shoal.run(_train_nothing, nproc=2, fault_tolerance=True, device="cuda")


def test_each_group_gets_its_share_of_the_gpus():
    """A group's CUDA_VISIBLE_DEVICES (shoal.train.ft.supervisor): the next K of the node's GPUs,
    counted from the node's first group; groups of one process take turns when GPUs are fewer."""
    from shoal.train.ft.supervisor import _Layout

    four = ("0", "1", "2", "3")
    assert [_Layout(2, 0, 2, group_nproc=2, gpus=four).gpus_of(g) for g in (0, 1)] == ["0,1", "2,3"]
    assert [_Layout(2, 2, 4, group_nproc=2, gpus=four).gpus_of(g) for g in (2, 3)] == ["0,1", "2,3"]  # node 1
    uuids = ("GPU-a", "GPU-b")  # as CUDA_VISIBLE_DEVICES may name them
    assert [_Layout(4, 0, 4, gpus=uuids).gpus_of(g) for g in range(4)] == ["GPU-a", "GPU-b", "GPU-a", "GPU-b"]
    assert _Layout(2, 0, 2).gpus_of(0) is None  # the CPU


def _broken(steps):
    return steps + "1"  # a TypeError in the user's code, before any training


@pytest.mark.multiprocess
def test_a_function_that_fails_before_it_trains_stops_the_job_at_once(capfd):
    """Every group would fail the same way at every start: the job stops after the first, each
    group's traceback said once, none restarted (before, 10 restarts and 22 tracebacks)."""
    import shoal

    with pytest.raises(ShoalError) as err:
        shoal.run(_broken, 3, nproc=2, fault_tolerance=True)
    assert "failed before it trained, at its first start" in err.value.message, err.value.message
    assert "traceback above" in err.value.hint
    output = capfd.readouterr().err
    assert 1 <= output.count("TypeError: unsupported operand") <= 2, output  # a group's own, once
    assert "restarting it" not in output, output
