"""A job's shape is checked in one place (``shoal.shape``): the same bad value gets the same words
from ``LaunchOptions`` (``shoal run``, ``shoal train``, ``shoal.fit``, ``shoal.run``) and from
``JobSpec`` (``shoal launch``)."""

from __future__ import annotations

import pytest

from shoal.errors import ShoalError
from shoal.jobs.spec import JobSpec
from shoal.launch.options import LaunchOptions
from shoal.shape import RDZV_BACKENDS, START_METHODS, check_nproc


def _message(build) -> str:
    with pytest.raises(ShoalError) as info:
        build()
    assert info.value.hint, info.value.message
    return info.value.message


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("master_port", 70000, "--master-port 70000 is not a TCP port"),
        ("max_restarts", -1, "--max-restarts must be 0 or more, got -1"),
        ("rdzv_backend", "etcd", "unknown rendezvous 'etcd'"),
    ],
)
def test_launch_options_and_a_job_spec_refuse_alike(field, value, words):
    assert _message(lambda: LaunchOptions(**{field: value})) == words
    assert _message(lambda: JobSpec(command=("shoal", "train"), **{field: value})) == words


def test_processes_per_node_is_one_flag_in_every_command():
    assert _message(lambda: LaunchOptions(nproc=0)) == "--nproc must be at least 1, got 0"
    assert _message(lambda: JobSpec(command=("x.py",), nproc=0)) == "--nproc must be at least 1 or auto, got 0"
    JobSpec(command=("x.py",), nproc="auto")  # shoal launch takes auto; a launcher counts processes
    with pytest.raises(ShoalError, match="--nproc must be at least 1"):
        check_nproc("auto")
    with pytest.raises(ShoalError, match="got True"):
        check_nproc(True)  # a bool is no count


def test_the_choices_are_the_launchers():
    assert _message(lambda: LaunchOptions(start_method="thread")) == "unknown start method 'thread'"
    assert START_METHODS == ("auto", "fork", "spawn") and RDZV_BACKENDS == ("static", "c10d")
